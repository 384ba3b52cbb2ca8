//! An approver's desk as a team server's approver listener sees it, for the tests and benches
//! of `countersign serve`: an approver key, a self-signed certificate of it, signed decisions,
//! and requests over mutual TLS (blocking: call them from `spawn_blocking` in async tests).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

/// A person's desk as the approver listener sees it: its approver key, and the self-signed
/// certificate of that key it connects with.
pub struct Desk {
    /// Its approver key.
    pub key: countersign_core::approver::ApproverKey,
    /// Its certificate.
    pub cert: rustls::pki_types::CertificateDer<'static>,
}

impl Desk {
    /// The desk whose key's seed is 32 bytes of `seed`.
    pub fn new(seed: u8) -> Desk {
        let key = countersign_core::approver::ApproverKey::from_seed(&[seed; 32]);
        let pair = rcgen::KeyPair::try_from(key.pkcs8_der().as_slice()).unwrap();
        let cert = rcgen::CertificateParams::new(vec![format!("approver-{seed}")])
            .unwrap()
            .self_signed(&pair)
            .unwrap();
        Desk {
            key,
            cert: cert.der().clone(),
        }
    }

    /// Sends `decision` (as [`Desk::decide`] made it) to the approver listener at `port`, whose
    /// certificate is `trusted`: the status and the answer.
    pub fn send(
        &self,
        port: u16,
        trusted: &rustls::pki_types::CertificateDer<'static>,
        decision: &Value,
    ) -> (u16, Value) {
        on_approver_listener(
            port,
            trusted,
            Some(self),
            "POST",
            "/approver/v1/decisions",
            &[],
            &decision.to_string(),
        )
        .unwrap()
    }

    /// Approves the first call waiting on the approver listener at `port` (a server that names
    /// itself `https://localhost:PORT`): the status and the answer.
    pub fn approve_first(
        &self,
        port: u16,
        trusted: &rustls::pki_types::CertificateDer<'static>,
    ) -> (u16, Value) {
        let request = first_waiting(port, trusted, self);
        let server = format!("https://localhost:{port}");
        let decision = self.decide(
            &server,
            &request,
            countersign_core::approver::Verdict::Approve,
            |_| {},
        );
        self.send(port, trusted, &decision)
    }

    /// Its public key, as `countersign serve approver add` takes it.
    pub fn public_text(&self) -> String {
        countersign_core::approver::public_key_text(&self.key.public())
    }

    /// `verdict` on the waiting `request` (as the listener listed it), signed for `server` and
    /// good for a minute, with `change` applied to the decision before it is signed.
    pub fn decide(
        &self,
        server: &str,
        request: &Value,
        verdict: countersign_core::approver::Verdict,
        change: impl FnOnce(&mut SignedFields),
    ) -> Value {
        let asks = &request["asks"];
        let mut fields = SignedFields {
            server: server.to_owned(),
            request: request["id"].as_u64().unwrap(),
            plan: countersign_core::PlanHash::from_hex(asks["plan_hash"].as_str().unwrap())
                .unwrap(),
            tenant: asks["tenant"].as_str().unwrap().to_owned(),
            tool: request["plan"]["tool"].as_str().unwrap().to_owned(),
            target: request["plan"]["target"].as_str().unwrap().to_owned(),
            class: countersign_core::GateClass::from_code(asks["class"].as_str().unwrap()).unwrap(),
            expires_at_ms: now_ms() + 60_000,
        };
        change(&mut fields);
        let decision = countersign_core::approver::Decision {
            server: &fields.server,
            request: fields.request,
            verdict,
            plan: &fields.plan,
            tenant: &fields.tenant,
            tool: &fields.tool,
            target: &fields.target,
            class: fields.class,
            expires_at_ms: fields.expires_at_ms,
        };
        use base64::Engine as _;
        let signature =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.key.sign(&decision));
        // The server is signed, never sent: the listener puts its own name in.
        json!({
            "request": fields.request,
            "verdict": verdict.code(),
            "plan": fields.plan.to_hex(),
            "tenant": fields.tenant,
            "tool": fields.tool,
            "target": fields.target,
            "class": fields.class.code(),
            "expiresAtMs": fields.expires_at_ms,
            "signature": signature,
        })
    }
}

/// The fields of a decision that are signed.
#[derive(Clone)]
#[allow(missing_docs)]
pub struct SignedFields {
    pub server: String,
    pub request: u64,
    pub plan: countersign_core::PlanHash,
    pub tenant: String,
    pub tool: String,
    pub target: String,
    pub class: countersign_core::GateClass,
    pub expires_at_ms: u64,
}

/// Now, in ms since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// One request on the approver listener at `port` (whose certificate is `trusted`), as `desk`
/// (or with no client certificate): the status and the JSON body, or why no answer came.
pub fn on_approver_listener(
    port: u16,
    trusted: &rustls::pki_types::CertificateDer<'static>,
    desk: Option<&Desk>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<(u16, Value), String> {
    let (status, _, body) = over_tls(port, trusted, desk, method, path, headers, body)?;
    Ok((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
}

/// One request over TLS to `port` (whose certificate is `trusted`, for `localhost`), as `desk`
/// (or with no client certificate): the status, the head and the body as text, or why no answer
/// came.
pub fn over_tls(
    port: u16,
    trusted: &rustls::pki_types::CertificateDer<'static>,
    desk: Option<&Desk>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<(u16, String, String), String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trusted.clone()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match desk {
        Some(desk) => builder
            .with_client_auth_cert(
                vec![desk.cert.clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(desk.key.pkcs8_der().to_vec().into()),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(40))).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    tls.write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    if let Err(e) = tls.read_to_end(&mut response)
        && response.is_empty()
    {
        return Err(e.to_string());
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or(text.clone())?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or(head.to_owned())?;
    Ok((status, head.to_owned(), body.to_owned()))
}

/// The first call waiting on the approver listener at `port`, as `desk` reads it (waiting on
/// the listener for one to arrive).
pub fn first_waiting(
    port: u16,
    trusted: &rustls::pki_types::CertificateDer<'static>,
    desk: &Desk,
) -> Value {
    let mut seen = String::new();
    loop {
        let path = format!("/approver/v1/requests?wait=20&seen={seen}");
        let (status, body) =
            on_approver_listener(port, trusted, Some(desk), "GET", &path, &[], "").unwrap();
        assert_eq!(status, 200, "{body}");
        if let Some(first) = body["requests"].as_array().and_then(|r| r.first()) {
            return first["request"].clone();
        }
        seen = body["digest"].as_str().unwrap().to_owned();
    }
}

/// The waiting calls desks see on the approver listener at `port`, as `desk` reads them now.
pub fn waiting_now(
    port: u16,
    trusted: &rustls::pki_types::CertificateDer<'static>,
    desk: &Desk,
) -> Vec<Value> {
    let (status, body) = on_approver_listener(
        port,
        trusted,
        Some(desk),
        "GET",
        "/approver/v1/requests",
        &[],
        "",
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    body["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["request"].clone())
        .collect()
}
