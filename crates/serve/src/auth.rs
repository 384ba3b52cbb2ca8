//! Who is calling: the tenant is the caller the server authenticated, never what the message
//! says.
//!
//! The server is an OAuth 2.1 resource server as the MCP authorization specification asks: it
//! publishes its protected-resource metadata (RFC 9728) at the well-known path, answers a request
//! without a usable bearer token `401` with a `WWW-Authenticate` header naming that metadata,
//! and accepts only JWT access tokens whose signature checks against the issuer's keys (its JWKS,
//! fetched and refreshed, or a key file for sites without a route to the issuer), whose issuer is
//! the configured one, whose audience is this resource (RFC 8707), which have not expired, and
//! which carry the configured scope (`403 insufficient_scope` otherwise). Only asymmetric
//! algorithms are accepted: a shared-secret (`HS*`) or unsigned token proves nothing about who
//! made it. The tenant is `jwt:` + issuer + `#` + subject.
//!
//! For a team without an identity provider, the server issues agent keys itself
//! (`countersign serve agent add NAME`, outside the MCP authorization spec): a random bearer key
//! shown once, kept only as its SHA-256 hash in the server's records, revocable: each replica
//! keeps an active key it read for at most [`AGENT_KEY_FRESH`] (a request otherwise reads the
//! records), so a revoked key is refused on every replica within that. The tenant is `key:` +
//! the agent's name.
//!
//! An agent's bearer token stops here: it is never put in the request the session sees, so it
//! can never reach an upstream.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::RwLock;

use countersign_store::{Records, Roster};
use sha2::{Digest, Sha256};

use crate::http::Caller;

/// What every agent key starts with: a key is told from a JWT before anything is parsed.
pub const AGENT_KEY_PREFIX: &str = "csk_";

/// A new agent key and the hash the records keep of it.
pub fn new_agent_key() -> (zeroize::Zeroizing<String>, [u8; 32]) {
    use base64::Engine as _;
    let bytes: [u8; 32] = rand::random();
    let key = zeroize::Zeroizing::new(format!(
        "{AGENT_KEY_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ));
    let hash = agent_key_hash(&key);
    (key, hash)
}

/// The hash the records keep of an agent key.
pub fn agent_key_hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// The RSA algorithms an access token may be signed with.
const RSA: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];

/// The elliptic-curve ones.
const EC: &[Algorithm] = &[Algorithm::ES256, Algorithm::ES384];

/// The Edwards-curve one.
const ED: &[Algorithm] = &[Algorithm::EdDSA];

/// Whether an access token may be signed with `alg`: asymmetric algorithms only.
pub fn accepted_algorithm(alg: Algorithm) -> bool {
    [RSA, EC, ED].iter().any(|family| family.contains(&alg))
}

/// How long the issuer's keys are trusted before they are fetched again.
pub const JWKS_MAX_AGE: Duration = Duration::from_secs(10 * 60);

/// The least time between two fetches of the issuer's keys (a token naming an unknown key
/// fetches them again, at most this often: a flood of made-up key ids cannot hammer the issuer).
pub const JWKS_MIN_INTERVAL: Duration = Duration::from_secs(60);

/// Clock skew allowed on `exp` and `nbf`, in seconds.
pub const LEEWAY_SECS: u64 = 30;

/// The issuer's verification keys.
pub enum Keys {
    /// One key from a PEM file (air-gapped sites): every token must be signed by it.
    File {
        /// The key.
        key: DecodingKey,
        /// The algorithms it can verify.
        algorithms: Vec<Algorithm>,
    },
    /// The issuer's JWKS, fetched from `url`.
    Jwks {
        /// Where.
        url: String,
        /// The last set fetched, and when.
        cache: RwLock<Option<(JwkSet, Instant)>>,
        /// When it was last tried (success or not); held while a fetch runs.
        tried: tokio::sync::Mutex<Option<Instant>>,
        /// The HTTP client.
        client: reqwest::Client,
    },
}

/// A parser of one kind of PEM public key, and the algorithms that kind verifies.
type PemKind = (
    fn(&[u8]) -> jsonwebtoken::errors::Result<DecodingKey>,
    &'static [Algorithm],
);

/// Why keys could not be read from a PEM file.
#[derive(Debug, thiserror::Error)]
#[error("--jwt-key-file {file}: {why}")]
pub struct KeyFileError {
    /// The file.
    pub file: String,
    /// Why.
    pub why: String,
}

impl Keys {
    /// The public key in `pem` (RSA, EC P-256/P-384, or Ed25519).
    pub fn from_pem(file: &str, pem: &[u8]) -> Result<Keys, KeyFileError> {
        let attempts: [PemKind; 3] = [
            (DecodingKey::from_rsa_pem, RSA),
            (DecodingKey::from_ec_pem, EC),
            (DecodingKey::from_ed_pem, ED),
        ];
        for (parse, algorithms) in attempts {
            if let Ok(key) = parse(pem) {
                return Ok(Keys::File {
                    key,
                    algorithms: algorithms.to_vec(),
                });
            }
        }
        Err(KeyFileError {
            file: file.to_owned(),
            why: "not a PEM public key (RSA, EC P-256/P-384 or Ed25519)".into(),
        })
    }

    /// The issuer's JWKS at `url`, fetched when first needed.
    pub fn jwks(url: String) -> Keys {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        Keys::Jwks {
            url,
            cache: RwLock::new(None),
            tried: tokio::sync::Mutex::new(None),
            client,
        }
    }

    /// The key that signed a token with this header, and whether its algorithm may be used.
    async fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Result<DecodingKey, Denied> {
        match self {
            Keys::File { key, algorithms } => {
                if algorithms.contains(&alg) {
                    Ok(key.clone())
                } else {
                    Err(Denied::Invalid(
                        "the token's algorithm does not match the key",
                    ))
                }
            }
            Keys::Jwks {
                url,
                cache,
                tried,
                client,
            } => {
                let found = |set: &JwkSet| -> Option<DecodingKey> {
                    let jwk = match kid {
                        Some(kid) => set.find(kid)?,
                        // No key id: only an issuer with a single key can be meant.
                        None if set.keys.len() == 1 => &set.keys[0],
                        None => return None,
                    };
                    DecodingKey::from_jwk(jwk).ok()
                };
                {
                    let cache = cache.read().await;
                    if let Some((set, at)) = &*cache
                        && at.elapsed() < JWKS_MAX_AGE
                        && let Some(key) = found(set)
                    {
                        return Ok(key);
                    }
                }
                // An unknown key, keys too old, or none yet: fetch them again, one request at a
                // time and at most once a minute (whoever waited finds what the other fetched).
                {
                    let mut tried = tried.lock().await;
                    if tried.is_none_or(|t| t.elapsed() >= JWKS_MIN_INTERVAL) {
                        *tried = Some(Instant::now());
                        match fetch(client, url).await {
                            Ok(set) => *cache.write().await = Some((set, Instant::now())),
                            Err(why) => {
                                tracing::warn!(target: "auth", url = %url, "could not fetch the issuer's keys: {why}");
                            }
                        }
                    }
                }
                let cache = cache.read().await;
                match &*cache {
                    Some((set, _)) => {
                        found(set).ok_or(Denied::Invalid("no key of the issuer matches the token"))
                    }
                    None => Err(Denied::KeysUnavailable),
                }
            }
        }
    }
}

/// Why the issuer's keys could not be fetched: said in the log (requests are then judged with the
/// keys fetched before, if any).
#[derive(Debug, thiserror::Error)]
enum FetchError {
    /// The request failed: not sent, or no answer read.
    #[error("{0}")]
    Request(#[source] reqwest::Error),
    /// The issuer answered with an error status.
    #[error("HTTP {0}")]
    Status(reqwest::StatusCode),
    /// The answer is larger than a key set is.
    #[error("the key set is larger than 1 MiB")]
    TooLarge,
    /// The answer is not a JWK set.
    #[error("not a JWK set: {0}")]
    NotJwks(#[source] serde_json::Error),
}

async fn fetch(client: &reqwest::Client, url: &str) -> Result<JwkSet, FetchError> {
    let response = client.get(url).send().await.map_err(FetchError::Request)?;
    if !response.status().is_success() {
        return Err(FetchError::Status(response.status()));
    }
    // A key set is small: a huge answer is not one.
    let bytes = response.bytes().await.map_err(FetchError::Request)?;
    if bytes.len() > 1024 * 1024 {
        return Err(FetchError::TooLarge);
    }
    serde_json::from_slice(&bytes).map_err(FetchError::NotJwks)
}

/// How this server authenticates its callers.
pub struct Auth {
    /// The OAuth resource server, if configured.
    pub oauth: Option<OAuth>,
    /// Every request is the one caller `unauthenticated` (loopback only).
    pub unauthenticated: bool,
    /// Where the agent keys this server issued are, if it accepts them.
    pub agent_keys: Option<Arc<dyn Records>>,
    /// The names of the servers file's servers (their endpoints' metadata is published).
    pub servers: HashSet<String>,
    /// The active agent keys read lately, by hash: what the records said, and when.
    pub read_keys: KeyCache,
}

/// How long a replica takes an agent key it found active on the records' word, before it reads
/// them again: a revoked key is refused on every replica within this (and a read that fails
/// never extends it).
pub const AGENT_KEY_FRESH: Duration = Duration::from_secs(1);

/// The most agent keys kept read at once: past it, all are read again.
const MOST_KEYS_KEPT: usize = 4096;

/// Active agent keys as the records last said, by hash, with when (see [`AGENT_KEY_FRESH`]).
/// Only an active key is kept: an unknown or revoked one is read every time, so a key added is
/// taken at once.
#[derive(Default)]
pub struct KeyCache(std::sync::Mutex<std::collections::HashMap<[u8; 32], (String, Instant)>>);

impl KeyCache {
    /// The name of the active key `hash`, if it was read within [`AGENT_KEY_FRESH`] of `now`.
    fn fresh(&self, hash: &[u8; 32], now: Instant) -> Option<String> {
        let kept = countersign_core::sync::lock(&self.0);
        kept.get(hash)
            .filter(|(_, at)| now.saturating_duration_since(*at) < AGENT_KEY_FRESH)
            .map(|(name, _)| name.clone())
    }

    /// Keeps `name` as the active key `hash`, read at `at`.
    fn keep(&self, hash: [u8; 32], name: &str, at: Instant) {
        let mut kept = countersign_core::sync::lock(&self.0);
        if kept.len() >= MOST_KEYS_KEPT {
            kept.clear();
        }
        kept.insert(hash, (name.to_owned(), at));
    }

    /// Forgets `hash` (read again as unknown or revoked).
    fn forget(&self, hash: &[u8; 32]) {
        countersign_core::sync::lock(&self.0).remove(hash);
    }
}

/// The OAuth resource server's settings.
pub struct OAuth {
    /// The issuer (`iss`), as the authorization server names itself.
    pub issuer: String,
    /// This resource's canonical URI: the audience tokens must name, and the metadata's
    /// `resource`.
    pub resource: String,
    /// The scope a token must carry, if any.
    pub scope: Option<String>,
    /// The issuer's keys.
    pub keys: Keys,
}

impl OAuth {
    /// The resource identifier of the endpoint of `server` (a servers file's name), or of the
    /// one endpoint: `--resource`, with `/<name>` after it for a named one.
    pub fn resource_of(&self, server: Option<&str>) -> String {
        match server {
            Some(name) => format!("{}/{name}", self.resource.trim_end_matches('/')),
            None => self.resource.clone(),
        }
    }

    /// Where the metadata of the endpoint of `server` is published (RFC 9728 §3: the
    /// well-known path inserted before the resource's path).
    pub fn metadata_url(&self, server: Option<&str>) -> String {
        let resource = self.resource_of(server);
        match resource.split_once("://") {
            Some((scheme, rest)) => {
                let (host, path) = match rest.find('/') {
                    Some(i) => rest.split_at(i),
                    None => (rest, ""),
                };
                let path = path.trim_end_matches('/');
                format!("{scheme}://{host}/.well-known/oauth-protected-resource{path}")
            }
            None => resource.clone(),
        }
    }

    /// The metadata document of the endpoint of `server`.
    pub fn metadata(&self, server: Option<&str>) -> serde_json::Value {
        let mut doc = json!({
            "resource": self.resource_of(server),
            "authorization_servers": [self.issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": "Countersign",
        });
        if let Some(scope) = &self.scope {
            doc["scopes_supported"] = json!([scope]);
        }
        doc
    }

    /// The caller a bearer token for the endpoint of `server` names, or why it names none. Its
    /// audience is that endpoint's resource, or the whole server's (`--resource`).
    pub async fn caller(&self, token: &str, server: Option<&str>) -> Result<Caller, Denied> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| Denied::Invalid("the bearer token is not a JWT"))?;
        if !accepted_algorithm(header.alg) {
            return Err(Denied::Invalid("the token's algorithm is not accepted"));
        }
        let key = self.keys.key_for(header.kid.as_deref(), header.alg).await?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[self.resource.clone(), self.resource_of(server)]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        let data = jsonwebtoken::decode::<Claims>(token, &key, &validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            Denied::Invalid(match e.kind() {
                ErrorKind::ExpiredSignature => "the token has expired",
                ErrorKind::ImmatureSignature => "the token is not valid yet",
                ErrorKind::InvalidAudience => "the token is not for this resource (audience)",
                ErrorKind::InvalidIssuer => "the token is from another issuer",
                ErrorKind::InvalidSignature => "the token's signature does not check",
                ErrorKind::MissingRequiredClaim(_) => "the token lacks a required claim",
                _ => "the token is not acceptable",
            })
        })?;
        let claims = data.claims;
        if let Some(scope) = &self.scope
            && !claims.scopes().contains(scope.as_str())
        {
            return Err(Denied::InsufficientScope);
        }
        if claims.sub.is_empty() {
            return Err(Denied::Invalid("the token names no subject"));
        }
        Ok(Caller::authenticated(format!(
            "jwt:{}#{}",
            self.issuer, claims.sub
        )))
    }
}

/// The claims read beyond what the validation checks.
#[derive(Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    scp: Option<Vec<String>>,
}

impl Claims {
    fn scopes(&self) -> HashSet<&str> {
        let mut all: HashSet<&str> = self
            .scope
            .as_deref()
            .map(|s| s.split_whitespace().collect())
            .unwrap_or_default();
        all.extend(self.scp.iter().flatten().map(String::as_str));
        all
    }
}

/// Why a request was not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No bearer token.
    Missing,
    /// A token that does not authenticate anyone: why, in a few words (never the token).
    Invalid(&'static str),
    /// A valid token without the scope this server asks for.
    InsufficientScope,
    /// The issuer's keys could not be fetched: nothing can be checked just now.
    KeysUnavailable,
}

impl Auth {
    fn challenge(&self, denied: Denied, server: Option<&str>) -> Response {
        let metadata = self
            .oauth
            .as_ref()
            .map(|o| format!(r#", resource_metadata="{}""#, o.metadata_url(server)))
            .unwrap_or_default();
        let scope = self
            .oauth
            .as_ref()
            .and_then(|o| o.scope.as_ref())
            .map(|s| format!(r#", scope="{s}""#))
            .unwrap_or_default();
        let (status, code, message, www) = match denied {
            Denied::Missing => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this server needs a bearer token",
                format!("Bearer realm=\"countersign\"{metadata}{scope}"),
            ),
            Denied::Invalid(why) => (
                StatusCode::UNAUTHORIZED,
                "invalid_token",
                why,
                format!(
                    "Bearer realm=\"countersign\", error=\"invalid_token\", error_description=\"{why}\"{metadata}"
                ),
            ),
            Denied::InsufficientScope => (
                StatusCode::FORBIDDEN,
                "insufficient_scope",
                "the token does not carry the scope this server asks for",
                format!(
                    "Bearer realm=\"countersign\", error=\"insufficient_scope\"{scope}{metadata}"
                ),
            ),
            Denied::KeysUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "keys_unavailable",
                "the keys that check tokens cannot be read just now: try again shortly",
                String::new(),
            ),
        };
        let mut response = crate::http::refuse(status, code, message);
        if let Ok(value) = HeaderValue::from_str(&www)
            && !www.is_empty()
        {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, value);
        }
        response
    }

    /// The caller of a request with these headers, to the endpoint of `server`.
    pub async fn caller(
        &self,
        headers: &axum::http::HeaderMap,
        server: Option<&str>,
    ) -> Result<Caller, Denied> {
        if self.unauthenticated {
            return Ok(Caller::unauthenticated());
        }
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return Err(Denied::Missing);
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or(Denied::Missing)?;
        if token.starts_with(AGENT_KEY_PREFIX) {
            let Some(records) = &self.agent_keys else {
                return Err(Denied::Invalid("this server accepts no agent keys"));
            };
            let hash = agent_key_hash(token);
            // Taken before the read: a key revoked while it is read is not kept past the bound.
            let read_at = Instant::now();
            if let Some(name) = self.read_keys.fresh(&hash, read_at) {
                return Ok(Caller::authenticated(format!("key:{name}")));
            }
            return match records.member(Roster::Agents, &hash).await {
                Ok(Some(key)) if key.is_active() => {
                    self.read_keys.keep(hash, &key.name, read_at);
                    Ok(Caller::authenticated(format!("key:{}", key.name)))
                }
                Ok(_) => {
                    self.read_keys.forget(&hash);
                    Err(Denied::Invalid("the agent key is unknown or revoked"))
                }
                Err(e) => {
                    tracing::warn!(target: "auth", error = %e, "cannot read the agent keys");
                    Err(Denied::KeysUnavailable)
                }
            };
        }
        match &self.oauth {
            Some(oauth) => oauth.caller(token, server).await,
            None => Err(Denied::Invalid("this server accepts only its agent keys")),
        }
    }
}

/// The layer in front of the MCP endpoint: names the caller, or answers 401/403 and nothing
/// goes further. The `Authorization` header is taken off the request here.
pub async fn layer(State(auth): State<Arc<Auth>>, mut request: Request, next: Next) -> Response {
    // `/mcp/<name>`: the endpoint of a servers file's server, whose resource is its own.
    let server = request
        .uri()
        .path()
        .strip_prefix("/mcp/")
        .map(str::to_owned);
    let caller = auth.caller(request.headers(), server.as_deref()).await;
    request.headers_mut().remove(header::AUTHORIZATION);
    match caller {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(denied) => auth.challenge(denied, server.as_deref()),
    }
}

/// The protected-resource metadata (RFC 9728), for anyone: it is what a client reads to find
/// where to get a token.
pub async fn metadata(State(auth): State<Arc<Auth>>) -> Response {
    match &auth.oauth {
        Some(oauth) => crate::http::json_ok(&oauth.metadata(None)),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The metadata of the endpoint of the servers file's `name`.
pub async fn metadata_named(
    State(auth): State<Arc<Auth>>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    match &auth.oauth {
        Some(oauth) if auth.servers.contains(&name) => {
            crate::http::json_ok(&oauth.metadata(Some(&name)))
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oauth(resource: &str) -> OAuth {
        OAuth {
            issuer: "https://id.example.com".into(),
            resource: resource.into(),
            scope: Some("mcp:tools".into()),
            keys: Keys::jwks("https://id.example.com/jwks".into()),
        }
    }

    #[test]
    fn the_metadata_lives_at_the_well_known_path_before_the_resources_path() {
        assert_eq!(
            oauth("https://mcp.example.com/mcp").metadata_url(None),
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            oauth("https://mcp.example.com").metadata_url(None),
            "https://mcp.example.com/.well-known/oauth-protected-resource"
        );
        assert_eq!(
            oauth("https://mcp.example.com/mcp/").metadata_url(Some("github")),
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp/github"
        );
        assert_eq!(
            oauth("https://mcp.example.com/mcp").metadata(Some("github"))["resource"],
            "https://mcp.example.com/mcp/github"
        );
        let doc = oauth("https://mcp.example.com/mcp").metadata(None);
        assert_eq!(doc["resource"], "https://mcp.example.com/mcp");
        assert_eq!(doc["authorization_servers"][0], "https://id.example.com");
        assert_eq!(doc["scopes_supported"][0], "mcp:tools");
    }

    #[test]
    fn scopes_are_read_from_scope_and_scp() {
        let c: Claims =
            serde_json::from_value(json!({"sub": "a", "scope": "read mcp:tools", "scp": ["x"]}))
                .unwrap();
        assert_eq!(c.scopes(), HashSet::from(["read", "mcp:tools", "x"]));
    }

    /// An issuer's key endpoint on loopback that answers each connection with the next of
    /// `answers` (status line and body), then closes it.
    async fn issuer(answers: Vec<(&'static str, Vec<u8>)>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks", listener.local_addr().unwrap());
        tokio::spawn(async move {
            for (status, body) in answers {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&body).await;
            }
        });
        url
    }

    #[tokio::test]
    async fn an_issuer_that_answers_an_error_a_huge_body_or_no_key_set_gives_no_keys_and_admits_nobody()
     {
        let client = reqwest::Client::new();
        let url = issuer(vec![
            ("500 Internal Server Error", b"{}".to_vec()),
            ("200 OK", vec![b' '; 1024 * 1024 + 1]),
            ("200 OK", b"{\"keys\": \"not a list\"}".to_vec()),
            ("200 OK", b"{\"keys\": [], \"keys\": []".to_vec()),
        ])
        .await;
        assert!(matches!(
            fetch(&client, &url).await,
            Err(FetchError::Status(s)) if s.as_u16() == 500
        ));
        assert!(matches!(
            fetch(&client, &url).await,
            Err(FetchError::TooLarge)
        ));
        assert!(matches!(
            fetch(&client, &url).await,
            Err(FetchError::NotJwks(_))
        ));
        assert!(matches!(
            fetch(&client, &url).await,
            Err(FetchError::NotJwks(_))
        ));
        // A server whose issuer answers nothing usable refuses every token as keys unavailable
        // (never as valid, never by falling back to anything).
        let url = issuer(vec![("200 OK", b"<html>".to_vec())]).await;
        let keys = Keys::jwks(url);
        assert_eq!(
            keys.key_for(Some("k1"), Algorithm::RS256).await.err(),
            Some(Denied::KeysUnavailable)
        );
    }

    #[tokio::test]
    async fn shared_secret_and_unsigned_tokens_are_refused_before_any_key_is_looked_for() {
        let o = oauth("https://mcp.example.com/mcp");
        let hs = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(Algorithm::HS256),
            &json!({"sub": "a", "iss": "https://id.example.com", "aud": "https://mcp.example.com/mcp", "exp": 9999999999u64}),
            &jsonwebtoken::EncodingKey::from_secret(b"guessable").unwrap(),
        )
        .unwrap();
        assert_eq!(
            o.caller(&hs, None).await.unwrap_err(),
            Denied::Invalid("the token's algorithm is not accepted")
        );
        // alg "none": not even a JWT to this library.
        let none = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIn0.";
        assert!(matches!(
            o.caller(none, None).await,
            Err(Denied::Invalid(_))
        ));
    }
}
