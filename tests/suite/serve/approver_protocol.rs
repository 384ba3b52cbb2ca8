//! The approver protocol document against a real server: a listing has exactly the members and
//! types of the document's example; a decision built, canonicalised, signed and encoded as the
//! document says (its examples and tables, read here; never the crates' own types) is accepted and
//! the agent's call runs; each refusal the document lists is what the server answers, with the
//! status it gives.

use super::*;
use countersign_core::approver::ApproverKey;
use serde_json::Map;

/// The document, as the repository holds it.
fn document() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/approver-protocol.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The document after its `<!-- marker -->`.
fn after<'a>(doc: &'a str, marker: &str) -> &'a str {
    let tag = format!("<!-- {marker} -->");
    let at = doc
        .find(&tag)
        .unwrap_or_else(|| panic!("the document has no {tag}"));
    &doc[at + tag.len()..]
}

/// The JSON example marked `<!-- example: NAME -->`: the fenced json block after the mark.
fn example(doc: &str, name: &str) -> Value {
    let rest = after(doc, &format!("example: {name}"));
    let open = rest
        .find("```json")
        .expect("a ```json block after the mark")
        + 7;
    let close = open + rest[open..].find("```").expect("the block's end");
    serde_json::from_str(&rest[open..close]).unwrap_or_else(|e| panic!("example {name}: {e}"))
}

/// The rows of the table marked `<!-- table: NAME -->`, header and rule left out.
fn table(doc: &str, name: &str) -> Vec<Vec<String>> {
    after(doc, &format!("table: {name}"))
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The first `code span` of `text`.
fn code(text: &str) -> Option<&str> {
    let start = text.find('`')? + 1;
    let end = start + text[start..].find('`')?;
    Some(&text[start..end])
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Where `real` differs from `example` in its members' names and JSON types, nested: an
/// array's elements each against the example's first; a free-form member by its type alone.
fn differences(path: &str, example: &Value, real: &Value, free: &[&str], out: &mut Vec<String>) {
    if kind(example) != kind(real) {
        out.push(format!(
            "{path}: the document has {}, the server {}",
            kind(example),
            kind(real)
        ));
        return;
    }
    if free.contains(&path) {
        return;
    }
    let join = |k: &str| {
        if path.is_empty() {
            k.to_owned()
        } else {
            format!("{path}.{k}")
        }
    };
    match (example, real) {
        (Value::Object(e), Value::Object(r)) => {
            for k in e.keys().filter(|k| !r.contains_key(*k)) {
                out.push(format!("{}: in the document, not in the server's", join(k)));
            }
            for k in r.keys().filter(|k| !e.contains_key(*k)) {
                out.push(format!("{}: in the server's, not in the document", join(k)));
            }
            for (k, ev) in e {
                if let Some(rv) = r.get(k) {
                    differences(&join(k), ev, rv, free, out);
                }
            }
        }
        (Value::Array(e), Value::Array(r)) => match e.first() {
            Some(first) => {
                for rv in r {
                    differences(&format!("{path}[]"), first, rv, free, out);
                }
            }
            None => out.push(format!("{path}: the document's example array is empty")),
        },
        _ => {}
    }
}

/// `real` has exactly the shape of the document's example `name`.
fn shaped_like(doc: &str, name: &str, real: &Value) {
    let mark = "<!-- free-form:";
    let at = doc
        .find(mark)
        .expect("the document marks the free-form members")
        + mark.len();
    let free_line = doc[at..].lines().next().unwrap_or_default();
    let free: Vec<&str> = free_line
        .trim_end_matches("-->")
        .split_whitespace()
        .collect();
    let mut out = Vec::new();
    differences("", &example(doc, name), real, &free, &mut out);
    assert!(out.is_empty(), "{name}: {out:#?}\nthe server's: {real:#}");
}

/// One signed member, as the document's table of them says.
struct Field {
    /// Its name in the signed object.
    name: String,
    /// `string` or `integer`.
    kind: String,
    /// Its name in the body sent, if sent.
    sent: Option<String>,
    /// Where it comes from: `$.…` in the listing, or what the client chooses.
    from: String,
}

/// The domain label (with its line feed) and the signed members, in the canonical order.
fn signing(doc: &str) -> (String, Vec<Field>) {
    let label = code(after(doc, "value: domain-label")).unwrap();
    assert!(
        after(doc, "value: domain-label").contains("one line feed (0x0A)"),
        "the label is followed by one line feed"
    );
    let fields: Vec<Field> = table(doc, "signed-fields")
        .into_iter()
        .map(|row| Field {
            name: code(&row[0]).unwrap().to_owned(),
            kind: row[1].clone(),
            sent: code(&row[2]).map(str::to_owned),
            from: match code(&row[3]) {
                Some(path) if path.starts_with("$.") => path.to_owned(),
                _ => row[3].clone(),
            },
        })
        .collect();
    // RFC 8785: members sorted by their UTF-16 code units; the table says it is in that order.
    let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
    assert_eq!(
        names, sorted,
        "the signed members are listed in canonical order"
    );
    (format!("{label}\n"), fields)
}

/// The value at `path` (`$.server`, `$.requests[i].request.id`) in `listing`, for its
/// `item`-th request.
fn at<'a>(listing: &'a Value, item: usize, path: &str) -> &'a Value {
    let mut here = listing;
    for step in path.strip_prefix("$.").unwrap().split('.') {
        here = match step.strip_suffix("[i]") {
            Some(array) => &here[array][item],
            None => &here[step],
        };
    }
    assert!(!here.is_null(), "{path} is in the listing: {listing}");
    here
}

/// The signed values for the `item`-th request of `listing`, with the client's choices.
fn values(
    fields: &[Field],
    listing: &Value,
    item: usize,
    verdict: &str,
    expires_at_ms: u64,
) -> Map<String, Value> {
    fields
        .iter()
        .map(|f| {
            let value = if f.from.starts_with("$.") {
                at(listing, item, &f.from).clone()
            } else if f.name == "verdict" {
                assert!(f.from.contains("approve") && f.from.contains("deny"));
                json!(verdict)
            } else if f.name == "expiresAtMs" {
                assert!(f.from.contains("600,000"), "{}", f.from);
                json!(expires_at_ms)
            } else {
                panic!("the document takes {} from {:?}", f.name, f.from)
            };
            (f.name.clone(), value)
        })
        .collect()
}

/// The bytes signed: the label, then the RFC 8785 text of the signed members, written as
/// the document spells it out (in order, no whitespace, strings escaped minimally).
fn message(label: &str, fields: &[Field], values: &Map<String, Value>) -> Vec<u8> {
    let members: Vec<String> = fields
        .iter()
        .map(|f| {
            let value = &values[&f.name];
            let text = match f.kind.as_str() {
                "string" => serde_json::to_string(value.as_str().unwrap()).unwrap(),
                "integer" => {
                    let n = value.as_u64().unwrap();
                    assert!(n < 1 << 53, "{} is at most 2^53 - 1", f.name);
                    n.to_string()
                }
                other => panic!("a signed member of type {other}"),
            };
            format!("{}:{text}", serde_json::to_string(&f.name).unwrap())
        })
        .collect();
    format!("{label}{{{}}}", members.join(",")).into_bytes()
}

/// The document's signature of `message` by `key`: Ed25519, in unpadded base64url.
fn signature(key: &ApproverKey, message: &[u8]) -> String {
    use base64::Engine as _;
    use rcgen::SigningKey as _;
    let pair = rcgen::KeyPair::try_from(key.pkcs8_der().as_slice()).unwrap();
    let signature = pair.sign(message).unwrap();
    assert_eq!(signature.len(), 64);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signature)
}

/// The body sent: the sent members, then the signature.
fn body(fields: &[Field], values: &Map<String, Value>, signature: &str) -> Value {
    let mut body: Map<String, Value> = fields
        .iter()
        .filter_map(|f| Some((f.sent.clone()?, values[&f.name].clone())))
        .collect();
    body.insert("signature".into(), json!(signature));
    Value::Object(body)
}

/// A decision on the `item`-th request of `listing` by `desk`, from the document alone.
fn decision(
    doc: &str,
    desk: &Desk,
    listing: &Value,
    item: usize,
    verdict: &str,
    change: impl FnOnce(&mut Map<String, Value>),
) -> Value {
    let (label, fields) = signing(doc);
    let mut values = values(&fields, listing, item, verdict, now_ms() + 60_000);
    change(&mut values);
    let signed = signature(&desk.key, &message(&label, &fields, &values));
    body(&fields, &values, &signed)
}

#[test]
fn the_documents_worked_example_and_decisions_are_the_signatures_the_server_checks() {
    let doc = document();
    let vector = example(&doc, "vector");
    let seed: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&vector["seed"].as_str().unwrap()[2 * i..2 * i + 2], 16))
        .collect::<Result<_, _>>()
        .unwrap();
    let key = ApproverKey::from_seed(&seed.try_into().unwrap());
    assert_eq!(
        countersign_core::approver::public_key_text(&key.public()),
        vector["public"].as_str().unwrap()
    );
    let listing = json!({
        "server": vector["listing"]["server"],
        "requests": [{"request": vector["listing"]["request"]}],
    });
    let (label, fields) = signing(&doc);
    for (verdict, name) in [("approve", "decision-approve"), ("deny", "decision-deny")] {
        let expires = vector["expiresAtMs"].as_u64().unwrap();
        let values = values(&fields, &listing, 0, verdict, expires);
        let bytes = message(&label, &fields, &values);
        let signed = signature(&key, &bytes);
        if verdict == "approve" {
            assert_eq!(String::from_utf8(bytes.clone()).unwrap(), vector["message"]);
            assert_eq!(signed, vector["signature"].as_str().unwrap());
        }
        // The bytes are the ones the server checks, and so is the signature.
        let plan = countersign_core::PlanHash::from_hex(values["plan"].as_str().unwrap());
        let plan = plan.unwrap();
        let decision = countersign_core::approver::Decision {
            server: values["server"].as_str().unwrap(),
            request: values["request"].as_u64().unwrap(),
            verdict: if verdict == "approve" {
                countersign_core::approver::Verdict::Approve
            } else {
                countersign_core::approver::Verdict::Deny
            },
            plan: &plan,
            tenant: values["tenant"].as_str().unwrap(),
            tool: values["tool"].as_str().unwrap(),
            target: values["target"].as_str().unwrap(),
            class: countersign_core::GateClass::from_code(values["class"].as_str().unwrap())
                .unwrap(),
            expires_at_ms: expires,
        };
        assert_eq!(decision.signed_bytes(), bytes);
        use base64::Engine as _;
        let raw: [u8; 64] = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&signed)
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(
            countersign_core::approver::verify(&key.public(), &decision, &raw, expires - 1),
            Ok(())
        );
        // The document's decision examples are this decision, sent.
        let mut sent = body(&fields, &values, &signed);
        if verdict == "deny" {
            sent["note"] = example(&doc, name)["note"].clone();
        }
        assert_eq!(sent, example(&doc, name), "{name}");
    }
}

/// A kept-open connection to the approver listener at `port` as `desk` (HTTP/1.1 keep-alive),
/// for what must happen on one connection: a revocation while it is open, two decisions sent
/// at one moment.
struct Connection(rustls::StreamOwned<rustls::ClientConnection, TcpStream>);

impl Connection {
    fn open(port: u16, trusted: &rustls::pki_types::CertificateDer<'static>, desk: &Desk) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(trusted.clone()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![desk.cert.clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(desk.key.pkcs8_der().to_vec().into()),
        )
        .unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let tls = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(40))).unwrap();
        let mut connection = Connection(rustls::StreamOwned::new(tls, tcp));
        // Through the handshake and one answer: let in.
        let (status, body) = connection.ask("GET", "/approver/v1/requests", "");
        assert_eq!(status, 200, "{body}");
        connection
    }

    fn send(&mut self, method: &str, path: &str, body: &str) {
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.0.write_all(request.as_bytes()).unwrap();
        self.0.flush().unwrap();
    }

    fn answer(&mut self) -> (u16, Value) {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let head_end = loop {
            if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let n = self.0.read(&mut buf).unwrap();
            assert!(n > 0, "the connection ended");
            got.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |n| n.trim().parse().unwrap());
        while got.len() < head_end + length {
            let n = self.0.read(&mut buf).unwrap();
            assert!(n > 0, "the connection ended");
            got.extend_from_slice(&buf[..n]);
        }
        let body = &got[head_end..head_end + length];
        (status, serde_json::from_slice(body).unwrap_or(Value::Null))
    }

    fn ask(&mut self, method: &str, path: &str, body: &str) -> (u16, Value) {
        self.send(method, path, body);
        self.answer()
    }
}

/// The listing as `desk` reads it once a call waits (long-polling as the document says).
fn listing_with_a_call(
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
        if body["requests"].as_array().is_some_and(|r| !r.is_empty()) {
            return body;
        }
        seen = body["digest"].as_str().unwrap().to_owned();
    }
}

type Asking = tokio::task::JoinHandle<rmcp::model::CallToolResult>;

fn ask(agent: &Arc<rmcp::service::RunningService<rmcp::RoleClient, ()>>, sql: &str) -> Asking {
    let (agent, arguments) = (agent.clone(), json!({ "sql": sql }));
    tokio::spawn(async move { call(&agent, "execute", arguments).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn a_decision_built_from_the_document_alone_is_approved_and_the_agents_call_runs() {
    let doc = document();
    let dsn = shared_database().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, trusted) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let policy = two_approvers_for_execute(dir.path(), &db);
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (alice, bob) = (Desk::new(61), Desk::new(62));
    add_approvers(&env, &[("alice", &alice), ("bob", &bob)]);
    let (code, agent_key, note) = roster_command("agent", &env, &["add", "ci"]);
    assert_eq!(code, 0, "{note}");
    let port = free_port();
    let url = format!("https://localhost:{port}");
    let mut args = approver_args("--agent-keys", &db, port, &url, &cert, &key);
    args.extend(["--policy".to_owned(), policy.to_str().unwrap().to_owned()]);
    let server = Server::start_before(
        &strs(&args),
        &[
            ("CONFIRM_SECRET", "approver-protocol-secret-0123456789ab"),
            ("CONTROL_DSN", &dsn),
        ],
        Some(&[]),
    );
    let agent = agent_with_key(server.url(), agent_key.trim()).await;
    let delete = json!({"sql": "DELETE FROM notes"});
    let asking = ask(&agent, "DELETE FROM notes");

    // The listing: the document's members and types, nested; its server is the URL.
    let listing = listing_with_a_call(port, &trusted, &alice);
    shaped_like(&doc, "listing", &listing);
    assert_eq!(listing["server"], url.as_str());
    assert_eq!(listing["requests"][0]["approvedBy"], json!([]));
    // The plan hashes to its plan_hash, as a client is told to check.
    let request = &listing["requests"][0]["request"];
    let plan: countersign_core::Plan = serde_json::from_value(request["plan"].clone()).unwrap();
    assert_eq!(plan.hash().unwrap().to_hex(), request["asks"]["plan_hash"]);

    // Alice's approval, from the document: recorded, one of two.
    let approve = decision(&doc, &alice, &listing, 0, "approve", |_| {});
    shaped_like(&doc, "decision-approve", &approve);
    let (status, answer) = alice.send(port, &trusted, &approve);
    assert_eq!(status, 202, "{answer}");
    shaped_like(&doc, "answer-recorded", &answer);
    assert_eq!(
        answer,
        json!({"outcome": "recorded", "approvals": 1, "needed": 2})
    );
    assert!(!asking.is_finished());
    // The listing now names her; a held read with its digest waits, then says the same.
    let (status, now) = on_approver_listener(
        port,
        &trusted,
        Some(&bob),
        "GET",
        "/approver/v1/requests",
        &[],
        "",
    )
    .unwrap();
    assert_eq!(status, 200);
    shaped_like(&doc, "listing", &now);
    assert_eq!(now["requests"][0]["approvedBy"], json!(["alice"]));
    let held = format!(
        "/approver/v1/requests?wait=1&seen={}",
        now["digest"].as_str().unwrap()
    );
    let started = Instant::now();
    let (_, again) =
        on_approver_listener(port, &trusted, Some(&bob), "GET", &held, &[], "").unwrap();
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(again["digest"], now["digest"]);

    // Bob's, from the document: approved; the agent's call runs.
    let approve = decision(&doc, &bob, &now, 0, "approve", |_| {});
    let (status, answer) = bob.send(port, &trusted, &approve);
    assert_eq!(status, 200, "{answer}");
    shaped_like(&doc, "answer-approved", &answer);
    assert_eq!(
        answer,
        json!({"outcome": "approved", "approvals": 2, "needed": 2})
    );
    let content = asking.await.unwrap().structured_content.unwrap();
    assert_eq!(content["approved"], true, "{content}");
    let ran = call(&agent, "execute", confirm_of(&delete, &content)).await;
    assert_ne!(ran.is_error, Some(true), "{ran:?}");
    assert_eq!(notes_in(&db), 0, "the approved call ran");

    // A deny with a note, shaped like the document's: the agent is told who and why.
    let asking = ask(&agent, "DELETE FROM notes WHERE id = 7");
    let listing = listing_with_a_call(port, &trusted, &alice);
    let mut deny = decision(&doc, &alice, &listing, 0, "deny", |_| {});
    deny["note"] = json!("not on a Friday");
    shaped_like(&doc, "decision-deny", &deny);
    let (status, answer) = alice.send(port, &trusted, &deny);
    assert_eq!(status, 200, "{answer}");
    shaped_like(&doc, "answer-denied", &answer);
    let denied = asking.await.unwrap();
    assert_eq!(denied.is_error, Some(true), "{denied:?}");
    assert!(
        text_of(&denied).contains("denied by approver alice: not on a Friday"),
        "{denied:?}"
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: run under .ci/with-postgres"]
async fn each_refusal_the_document_lists_is_what_serve_answers_with_its_status() {
    let doc = document();
    let statuses: std::collections::BTreeMap<String, u16> = table(&doc, "errors")
        .into_iter()
        .map(|row| (code(&row[0]).unwrap().to_owned(), row[1].parse().unwrap()))
        .collect();
    let error_example = example(&doc, "error");
    let answered = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let refused = |case: &str, code: &str, (status, body): (u16, Value)| {
        let documented = *statuses
            .get(code)
            .unwrap_or_else(|| panic!("{case}: `{code}` is not in the document's table"));
        assert_eq!(
            (status, body["error"].as_str()),
            (documented, Some(code)),
            "{case}: {body}"
        );
        let mut out = Vec::new();
        differences("", &error_example, &body, &[], &mut out);
        assert!(out.is_empty(), "{case}: {out:?}");
        answered.borrow_mut().insert(code.to_owned());
    };

    let postgres = countersign_tests::postgres::PrivateServer::start();
    let dsn = countersign_tests::postgres::fresh_database(&postgres.dsn()).await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, trusted) = self_signed(dir.path());
    let db = tools_db(dir.path());
    let env = [("CONTROL_DSN", dsn.as_str())];
    let (alice, bob, carol) = (Desk::new(71), Desk::new(72), Desk::new(73));
    add_approvers(&env, &[("alice", &alice), ("bob", &bob), ("carol", &carol)]);
    let port = free_port();
    let url = format!("https://localhost:{port}");
    let args = approver_args("--unauthenticated", &db, port, &url, &cert, &key);
    let server = Server::start_before(
        &strs(&args),
        &[
            ("CONFIRM_SECRET", "approver-protocol-errors-0123456789ab"),
            ("CONTROL_DSN", &dsn),
        ],
        Some(&[]),
    );
    let agent = Arc::new(agent(&server.url()).await);
    let asking = ask(&agent, "DELETE FROM notes");
    let listing = listing_with_a_call(port, &trusted, &alice);
    let number = listing["requests"][0]["request"]["id"].as_u64().unwrap();
    let post = |desk: &Desk, body: &str| {
        on_approver_listener(
            port,
            &trusted,
            Some(desk),
            "POST",
            "/approver/v1/decisions",
            &[],
            body,
        )
        .unwrap()
    };
    let good = decision(&doc, &alice, &listing, 0, "approve", |_| {});
    let with = |change: &dyn Fn(&mut Value)| {
        let mut body = good.clone();
        change(&mut body);
        body.to_string()
    };

    // Size: one byte over the limit; at the limit it is read (and refused for what it says).
    refused(
        "over 16,384 bytes",
        "too_large",
        post(&alice, &" ".repeat(16_385)),
    );
    let elsewhere = decision(&doc, &alice, &listing, 0, "approve", |v| {
        v["request"] = json!(number + 1_000_000)
    })
    .to_string();
    let padded = format!("{elsewhere}{}", " ".repeat(16_384 - elsewhere.len()));
    refused("at 16,384 bytes", "not_pending", post(&alice, &padded));
    // Not a decision's members.
    let text = good.to_string();
    let twice = format!(
        "{},\"plan\":\"{}\"}}",
        &text[..text.len() - 1],
        "ab".repeat(32)
    );
    for (case, body) in [
        ("not JSON", "{".to_owned()),
        ("an array", "[]".to_owned()),
        ("another member", with(&|b| b["server"] = json!(url))),
        ("a member twice", twice),
        (
            "a member missing",
            with(&|b| {
                b.as_object_mut().unwrap().remove("tenant");
            }),
        ),
        (
            "a number as a string",
            with(&|b| b["request"] = json!(number.to_string())),
        ),
        ("another verdict", with(&|b| b["verdict"] = json!("maybe"))),
        (
            "a plan in capitals",
            with(&|b| b["plan"] = json!(b["plan"].as_str().unwrap().to_uppercase())),
        ),
        ("no such class", with(&|b| b["class"] = json!("never"))),
        ("a long note", with(&|b| b["note"] = json!("n".repeat(501)))),
    ] {
        refused(case, "malformed", post(&alice, &body));
    }
    // Unsigned, or a signature not in the document's encoding.
    for (case, body) in [
        (
            "no signature",
            with(&|b| {
                b.as_object_mut().unwrap().remove("signature");
            }),
        ),
        ("a null signature", with(&|b| b["signature"] = Value::Null)),
        (
            "padded base64url",
            with(&|b| b["signature"] = json!(format!("{}==", b["signature"].as_str().unwrap()))),
        ),
        (
            "63 bytes",
            with(&|b| b["signature"] = json!(&b["signature"].as_str().unwrap()[..84])),
        ),
    ] {
        refused(case, "unsigned", post(&alice, &body));
    }
    // Signatures that do not hold on this connection, for this server, over what is sent.
    let bobs = decision(&doc, &bob, &listing, 0, "approve", |_| {});
    refused(
        "Bob's, on Alice's connection",
        "bad_signature",
        post(&alice, &bobs.to_string()),
    );
    let other = decision(&doc, &alice, &listing, 0, "approve", |v| {
        v["server"] = json!("https://other.example.com:9443")
    });
    refused(
        "for another server",
        "bad_signature",
        post(&alice, &other.to_string()),
    );
    let swapped = with(&|b| b["tool"] = json!("drop_table"));
    refused(
        "a sent field changed",
        "bad_signature",
        post(&alice, &swapped),
    );
    let stale_and_bad = decision(&doc, &bob, &listing, 0, "approve", |v| {
        v["expiresAtMs"] = json!(1_000)
    });
    refused(
        "expired and badly signed",
        "bad_signature",
        post(&alice, &stale_and_bad.to_string()),
    );
    // Times.
    let stale = decision(&doc, &alice, &listing, 0, "approve", |v| {
        v["expiresAtMs"] = json!(now_ms() - 1_000)
    });
    refused("expired", "expired", post(&alice, &stale.to_string()));
    let lasting = decision(&doc, &alice, &listing, 0, "approve", |v| {
        v["expiresAtMs"] = json!(now_ms() + 11 * 60_000)
    });
    refused(
        "eleven minutes",
        "expires_too_late",
        post(&alice, &lasting.to_string()),
    );
    // Another call than the one waiting, signed as such.
    for (case, member, value) in [
        ("another target", "target", json!("users")),
        ("another tenant", "tenant", json!("key:mallory@server:x")),
        ("another plan", "plan", json!("cd".repeat(32))),
        ("another class", "class", json!("token")),
        ("an open class", "class", json!("open")),
    ] {
        let body = decision(&doc, &alice, &listing, 0, "approve", |v| v[member] = value);
        refused(case, "does_not_match", post(&alice, &body.to_string()));
    }
    refused("no such call", "not_pending", post(&alice, &elsewhere));
    // None of that counted. The good one does; sent again, nothing waits.
    let (status, answer) = post(&alice, &good.to_string());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["outcome"], "approved");
    assert_eq!(
        asking.await.unwrap().structured_content.unwrap()["approved"],
        true
    );
    refused(
        "decided already",
        "not_pending",
        post(&alice, &good.to_string()),
    );

    // Two decisions at one moment on one call: one counts, the other is `decided` (or, if it
    // came after, `not_pending`).
    for round in 0.. {
        assert!(round < 10, "no two decisions met in ten rounds");
        let asking = ask(&agent, &format!("DELETE FROM notes WHERE id = {round}"));
        let listing = listing_with_a_call(port, &trusted, &alice);
        let mut pair = [
            (
                Connection::open(port, &trusted, &alice),
                decision(&doc, &alice, &listing, 0, "approve", |_| {}),
            ),
            (
                Connection::open(port, &trusted, &bob),
                decision(&doc, &bob, &listing, 0, "deny", |_| {}),
            ),
        ];
        for (connection, body) in &mut pair {
            connection.send("POST", "/approver/v1/decisions", &body.to_string());
        }
        let answers: Vec<(u16, Value)> = pair.iter_mut().map(|(c, _)| c.answer()).collect();
        asking.await.unwrap();
        let (won, lost): (Vec<_>, Vec<_>) = answers.into_iter().partition(|(s, _)| *s == 200);
        assert_eq!((won.len(), lost.len()), (1, 1), "{won:?} {lost:?}");
        let (status, body) = lost.into_iter().next().unwrap();
        if body["error"] == "decided" {
            refused("two at one moment", "decided", (status, body));
            break;
        }
        refused("two, one after the other", "not_pending", (status, body));
    }

    // Revoked while connected: every request on the open connection is refused, then the
    // handshake is.
    let mut open = Connection::open(port, &trusted, &carol);
    let (code, _, note) = roster_command("approver", &env, &["revoke", "carol"]);
    assert_eq!(code, 0, "{note}");
    refused(
        "reading, revoked",
        "approver_revoked",
        open.ask("GET", "/approver/v1/requests", ""),
    );
    let carols = decision(&doc, &carol, &listing, 0, "approve", |_| {});
    refused(
        "deciding, revoked",
        "approver_revoked",
        open.ask("POST", "/approver/v1/decisions", &carols.to_string()),
    );
    countersign_tests::postgres::wait_until(
        "the handshake refused",
        Duration::from_secs(10),
        || {
            on_approver_listener(
                port,
                &trusted,
                Some(&carol),
                "GET",
                "/approver/v1/requests",
                &[],
                "",
            )
            .is_err()
        },
    );

    // `bad_key` cannot be answered: the roster takes no key that is not a usable Ed25519 key
    // (the identity point here), and the handshake lets in only the roster's keys.
    use base64::Engine as _;
    let mut identity = [0u8; 32];
    identity[0] = 1;
    let weak = format!(
        "ed25519:{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(identity)
    );
    let (code, _, note) = roster_command("approver", &env, &["add", "weak", &weak]);
    assert_eq!(code, 2, "{note}");
    assert!(note.contains("bad_key"), "{note}");
    assert!(after(&doc, "table: errors").contains("Never answered today"));
    answered.borrow_mut().insert("bad_key".to_owned());

    // The records down: reading and deciding are refused, nothing decided.
    postgres.stop_immediately();
    let asked = on_approver_listener(
        port,
        &trusted,
        Some(&alice),
        "GET",
        "/approver/v1/requests",
        &[],
        "",
    );
    refused(
        "reading, records down",
        "records_unavailable",
        asked.unwrap(),
    );
    refused(
        "deciding, records down",
        "records_unavailable",
        post(&alice, &good.to_string()),
    );

    let listed: std::collections::BTreeSet<String> = statuses.keys().cloned().collect();
    assert_eq!(
        answered.into_inner(),
        listed,
        "each code the document lists, and only those"
    );
    drop(server);
}
