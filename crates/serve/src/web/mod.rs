//! The approvers' page (`--approver-web ADDR`): people approve this server's calls from any
//! browser, a phone's or a desktop's, each decision signed by their own passkey over the very
//! call.
//!
//! What the page is, and what it is not trusted with:
//! - **A page that interprets nothing.** Three files of our own (HTML, one script, one style
//!   sheet) under a strict Content-Security-Policy: no inline script, no other origin, no
//!   framing. Every string from an agent or an upstream arrives escaped and flagged by
//!   `countersign_core::shown`, as the desk's window gets it, and goes on screen as
//!   `textContent` through the desk's own `shown.js`.
//! - **Enrolled on purpose.** A passkey is registered only by a one-time invite
//!   (`countersign serve approver invite NAME`; 15 minutes, once, kept as a hash), with user
//!   verification. It joins the approver's name on the roster: a desk key and passkeys of one
//!   name are one person, counted once toward M-of-N; `approver revoke NAME` ends them all.
//! - **Signing in only lists.** A sign-in is a passkey assertion over a random challenge that is
//!   good once (on any replica); it opens a 15-minute session (`HttpOnly`, `Secure`,
//!   `SameSite=Strict` cookie, MAC'd with a key derived from the server's secret), checked
//!   against the roster on every use, so a revoked approver's open session lists nothing.
//! - **Deciding always needs a fresh assertion over the decision.** The challenge is the digest
//!   of the canonical decision (server, request, verdict, plan hash, tenant, tool, target, class,
//!   expiry; a domain label of its own), computed here from the waiting call and never taken from
//!   the page. The assertion must come from a passkey of the signed-in person, with user
//!   verification, its counter moving forward (recorded in one statement, so replicas cannot
//!   both accept it and a cloned authenticator shows). The decision is kept with the whole
//!   assertion before any replica mints, and `countersign serve verify-decisions` checks it
//!   again offline from the exported roster.
//! - **The approve delay holds here too.** The listing marks each call with when the page had
//!   it (MAC'd); an approval signed sooner than the delay after that is refused.
//! - **Other sites cannot act through a person's browser.** Every `POST` must carry this page's
//!   exact `Origin` and a JSON body (a cross-site form cannot send one without a preflight this
//!   server never grants); the cookie is `SameSite=Strict` besides.

// The handlers' helpers answer `Result<_, Response>`: the error is the refusal already written
// (status, stable code, message), sent as it is; it ends the request, so its size costs nothing.
#![allow(clippy::result_large_err)]

pub mod passkey;
mod view;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use countersign_core::GateClass;
use countersign_core::approver::{Decision, Verdict};
use countersign_core::page::{SESSION_MS, Session, seen_at, seen_mark};
use countersign_core::token::SigningKey;
use countersign_store::{Evidence, Passkey, Records, Roster, StoreError, WaitingCall};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::approvers::{Approvers, MAX_DECISION_TTL_MS, MAX_NOTE_CHARS};
use crate::http::{json_response, refuse};
use passkey::{PasskeyError, Relying, asserted_id};

/// How long an invite link works.
pub const INVITE_MS: u64 = 15 * 60 * 1_000;

/// How long a sign-in or decision challenge may take to be answered.
pub const CHALLENGE_MS: u64 = 2 * 60 * 1_000;

/// The largest body the page's API reads.
const MAX_BODY_BYTES: usize = 64 * 1024;

/// The session cookie's name.
const COOKIE: &str = "countersign_session";

/// The page's Content-Security-Policy: our own script and style, nothing else, never framed.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

const INDEX_HTML: &str = include_str!("page/index.html");
const PAGE_JS: &str = include_str!("page/page.js");
const PAGE_CSS: &str = include_str!("page/page.css");
/// The desk's own way of putting an escaped, flagged string on screen.
const SHOWN_JS: &str = include_str!("../../../../ui/shown.js");
/// The desk's own rows of a line diff, for a change of the rules.
const PREVIEW_JS: &str = include_str!("../../../../ui/preview.js");

/// What the page's listener serves.
pub struct Web {
    /// The approver side this page decides on (the same as desks').
    pub approvers: Arc<Approvers>,
    /// The relying party: this page's origin and RP ID.
    pub relying: Relying,
    /// The server's signing key: sessions and marks are MAC'd with keys derived from it.
    pub key: SigningKey,
    /// How long a call must have been on the page before it can be approved.
    pub approve_delay_ms: u64,
}

impl std::fmt::Debug for Web {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Web")
            .field("relying", &self.relying)
            .finish_non_exhaustive()
    }
}

/// The page's link to waiting call `row`, for notices: no token, no argument.
pub fn call_link(origin: &url::Url, row: u64) -> String {
    format!("{}/call/{row}", origin.as_str().trim_end_matches('/'))
}

/// The page's routes.
pub fn router(web: Arc<Web>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/invite", get(index))
        .route("/call/{id}", get(index))
        .route(
            "/page.js",
            get(|| asset(PAGE_JS, "text/javascript; charset=utf-8")),
        )
        .route(
            "/shown.js",
            get(|| asset(SHOWN_JS, "text/javascript; charset=utf-8")),
        )
        .route(
            "/preview.js",
            get(|| asset(PREVIEW_JS, "text/javascript; charset=utf-8")),
        )
        .route(
            "/page.css",
            get(|| asset(PAGE_CSS, "text/css; charset=utf-8")),
        )
        .route("/api/v1/enroll/begin", post(enroll_begin))
        .route("/api/v1/enroll/finish", post(enroll_finish))
        .route("/api/v1/signin/begin", post(signin_begin))
        .route("/api/v1/signin/finish", post(signin_finish))
        .route("/api/v1/signout", post(signout))
        .route("/api/v1/requests", get(requests))
        .route("/api/v1/decide/begin", post(decide_begin))
        .route("/api/v1/decide/finish", post(decide_finish))
        .layer(axum::middleware::from_fn_with_state(web.clone(), guard))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(web)
}

/// Every answer carries the page's headers; every `POST` must come from the page itself.
async fn guard(State(web): State<Arc<Web>>, request: Request, next: Next) -> Response {
    if request.method() == Method::POST {
        let refused = refused_post(&web, request.headers());
        if let Some(refused) = refused {
            // Read (bounded) what the client sends before answering: a connection closed with
            // its body unread is reset, and the client may lose the answer with it.
            let _ = axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES).await;
            return secure(refused);
        }
    }
    secure(next.run(request).await)
}

/// Why a `POST` is refused before it is read: another origin, or not JSON.
fn refused_post(web: &Web, headers: &HeaderMap) -> Option<Response> {
    let expected = web.relying.origin().origin().ascii_serialization();
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    if origin != Some(expected.as_str()) {
        tracing::warn!(target: "approvers", "a request to the approvers' page from another origin was refused");
        return Some(refuse(
            StatusCode::FORBIDDEN,
            "cross_origin",
            "only the approvers' page itself may ask this: nothing was done",
        ));
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next() == Some("application/json"));
    if !json {
        return Some(refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "not_json",
            "the page's API takes application/json only",
        ));
    }
    None
}

fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn index() -> Response {
    asset(INDEX_HTML, "text/html; charset=utf-8").await
}

async fn asset(body: &'static str, kind: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

fn bad(code: &str, message: &str) -> Response {
    refuse(StatusCode::BAD_REQUEST, code, message)
}

fn unavailable(e: &StoreError) -> Response {
    tracing::warn!(target: "approvers", error = %e, "records unavailable to the approvers' page");
    refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        "records_unavailable",
        "the server cannot read or keep its records now; nothing was done. Try again.",
    )
}

fn passkey_refused(e: &PasskeyError) -> Response {
    tracing::warn!(target: "approvers", code = e.code(), "a passkey response was refused: {e}");
    let status = match e {
        PasskeyError::Malformed(_) => StatusCode::BAD_REQUEST,
        PasskeyError::BadState(_) | PasskeyError::BadOrigin => StatusCode::INTERNAL_SERVER_ERROR,
        PasskeyError::Refused(_) => StatusCode::FORBIDDEN,
    };
    refuse(status, e.code(), &format!("{e}: nothing was done"))
}

fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Response> {
    serde_json::from_slice(body).map_err(|_| bad("malformed", "not the JSON this asks for"))
}

/// The invite code's hash, if `code` is one (32 bytes, base64url).
fn invite_hash(code: &str) -> Option<[u8; 32]> {
    let bytes = URL_SAFE_NO_PAD.decode(code.trim()).ok()?;
    (bytes.len() == 32).then(|| Sha256::digest(&bytes).into())
}

/// A new invite's code (shown once, in the link) and its hash (kept).
pub fn new_invite() -> (String, [u8; 32]) {
    let code: [u8; 32] = rand::random();
    (URL_SAFE_NO_PAD.encode(code), Sha256::digest(code).into())
}

/// The stable user handle of approver `name` (the same for each of its passkeys).
fn user_handle(name: &str) -> [u8; 16] {
    let digest = Sha256::digest(format!("countersign approver {name}"));
    let mut handle = [0; 16];
    handle.copy_from_slice(&digest[..16]);
    handle
}

/// Refuses approver `name` if it was revoked (the answer to send), or when the records cannot say.
async fn not_revoked(records: &Arc<dyn Records>, name: &str) -> Result<(), Response> {
    match revoked(records, name).await {
        Ok(false) => Ok(()),
        Ok(true) => Err(refuse(
            StatusCode::FORBIDDEN,
            "approver_revoked",
            "this approver was revoked: a revoked name is not enrolled again",
        )),
        Err(e) => Err(unavailable(&e)),
    }
}

/// Whether approver `name` was revoked (its desk key or any passkey): a revoked name is never
/// enrolled again.
pub async fn revoked(records: &Arc<dyn Records>, name: &str) -> Result<bool, StoreError> {
    let desks = records.members(Roster::Approvers).await?;
    let passkeys = records.passkeys().await?;
    Ok(desks.iter().any(|m| m.name == name && !m.is_active())
        || passkeys
            .iter()
            .any(|p| p.approver == name && !p.is_active()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InviteBody {
    invite: String,
    #[serde(default)]
    credential: Option<Value>,
}

const INVITE_UNUSABLE: &str = "this invite is not one the server made, or it expired, or it was used: ask for another \
     (`countersign serve approver invite NAME`)";

async fn enroll_begin(State(web): State<Arc<Web>>, body: Bytes) -> Response {
    let sent: InviteBody = match parse(&body) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let Some(hash) = invite_hash(&sent.invite) else {
        return refuse(StatusCode::NOT_FOUND, "invite_unusable", INVITE_UNUSABLE);
    };
    let records = &web.approvers.records;
    let now = web.approvers.engine.now_ms();
    let invite = match records.invite(&hash).await {
        Ok(Some(i)) if i.used_at_ms.is_none() && i.expires_at_ms > now => i,
        Ok(_) => return refuse(StatusCode::NOT_FOUND, "invite_unusable", INVITE_UNUSABLE),
        Err(e) => return unavailable(&e),
    };
    if let Err(refused) = not_revoked(records, &invite.approver).await {
        return refused;
    }
    let existing = match records.passkeys().await {
        Ok(all) => all
            .into_iter()
            .filter(|p| p.approver == invite.approver)
            .map(|p| p.credential_id)
            .collect(),
        Err(e) => return unavailable(&e),
    };
    let (options, ceremony) = match web.relying.begin_enrolment(
        &invite.approver,
        &user_handle(&invite.approver),
        existing,
    ) {
        Ok(begun) => begun,
        Err(e) => return passkey_refused(&e),
    };
    match records.begin_invite(&hash, &ceremony, now).await {
        Ok(true) => json_response(
            StatusCode::OK,
            &json!({ "approver": invite.approver, "options": options }),
        ),
        Ok(false) => refuse(StatusCode::NOT_FOUND, "invite_unusable", INVITE_UNUSABLE),
        Err(e) => unavailable(&e),
    }
}

async fn enroll_finish(State(web): State<Arc<Web>>, body: Bytes) -> Response {
    let sent: InviteBody = match parse(&body) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let (Some(hash), Some(credential)) = (invite_hash(&sent.invite), sent.credential) else {
        return refuse(StatusCode::NOT_FOUND, "invite_unusable", INVITE_UNUSABLE);
    };
    let records = &web.approvers.records;
    let now = web.approvers.engine.now_ms();
    let (invite, ceremony) = match records.invite(&hash).await {
        Ok(Some(i)) if i.used_at_ms.is_none() && i.expires_at_ms > now => {
            match i.ceremony.clone() {
                Some(c) => (i, c),
                None => return refuse(StatusCode::NOT_FOUND, "invite_unusable", INVITE_UNUSABLE),
            }
        }
        Ok(_) => return refuse(StatusCode::NOT_FOUND, "invite_unusable", INVITE_UNUSABLE),
        Err(e) => return unavailable(&e),
    };
    let enrolled = match web.relying.finish_enrolment(&credential, &ceremony) {
        Ok(enrolled) => enrolled,
        Err(e) => return passkey_refused(&e),
    };
    // Used up once, by the one update that finds it unused, with the ceremony just checked.
    match records.use_invite(&hash, now).await {
        Ok(Some(used)) if used.ceremony.as_deref() == Some(ceremony.as_str()) => {}
        Ok(_) => return refuse(StatusCode::NOT_FOUND, "invite_unusable", INVITE_UNUSABLE),
        Err(e) => return unavailable(&e),
    }
    // Revoked meanwhile (after the ceremony began): a revoked name is not enrolled again.
    if let Err(refused) = not_revoked(records, &invite.approver).await {
        return refused;
    }
    let passkey = Passkey {
        approver: invite.approver.clone(),
        credential_id: enrolled.0,
        credential: enrolled.1,
        counter: enrolled.2,
        created_at_ms: now,
        revoked_at_ms: None,
    };
    match records.put_passkey(&passkey).await {
        Ok(true) => {
            // A revocation between the check above and the insert would miss this passkey:
            // looked at again now that it is in, and revoked with its name if the name is.
            if let Err(refused) = not_revoked(records, &invite.approver).await {
                let _ = records
                    .revoke_member(Roster::Approvers, &invite.approver, now)
                    .await;
                tracing::warn!(target: "approvers", approver = %invite.approver, "a passkey enrolled as its approver was revoked was revoked with it");
                return refused;
            }
            tracing::info!(target: "approvers", approver = %invite.approver, "a passkey was enrolled");
            json_response(StatusCode::OK, &json!({ "enrolled": invite.approver }))
        }
        Ok(false) => refuse(
            StatusCode::CONFLICT,
            "credential_taken",
            "this passkey is on the roster already",
        ),
        Err(e) => unavailable(&e),
    }
}

async fn signin_begin(State(web): State<Arc<Web>>) -> Response {
    let challenge: [u8; 32] = rand::random();
    let now = web.approvers.engine.now_ms();
    if let Err(e) = web
        .approvers
        .records
        .put_challenge(&challenge, now.saturating_add(CHALLENGE_MS), now)
        .await
    {
        return unavailable(&e);
    }
    match web.relying.assertion_options(&challenge, &[]) {
        Ok(options) => json_response(StatusCode::OK, &json!({ "options": options })),
        Err(e) => passkey_refused(&e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SigninBody {
    credential: Value,
}

/// The challenge a browser's assertion says it answers (the check proves it did).
fn answered_challenge(response: &Value) -> Option<[u8; 32]> {
    let client = response["response"]["clientDataJSON"].as_str()?;
    let client = URL_SAFE_NO_PAD.decode(client.trim_end_matches('=')).ok()?;
    let client: Value = serde_json::from_slice(&client).ok()?;
    let challenge = URL_SAFE_NO_PAD
        .decode(client["challenge"].as_str()?.trim_end_matches('='))
        .ok()?;
    challenge.try_into().ok()
}

/// The active passkey an assertion names, or the answer refusing it.
async fn active_passkey(web: &Web, response: &Value) -> Result<Passkey, Response> {
    let unknown = || {
        refuse(
            StatusCode::FORBIDDEN,
            "unknown_passkey",
            "this passkey is not on the roster (never enrolled, or revoked): nothing was done",
        )
    };
    let id = asserted_id(response).ok_or_else(unknown)?;
    match web.approvers.records.passkey(&id).await {
        Ok(Some(p)) if p.is_active() => Ok(p),
        Ok(_) => Err(unknown()),
        Err(e) => Err(unavailable(&e)),
    }
}

/// Moves a passkey's counter forward for an assertion that checked, or refuses it.
async fn count(web: &Web, checked: &passkey::Checked) -> Result<(), Response> {
    match web
        .approvers
        .records
        .advance_passkey(&checked.credential_id, checked.counter)
        .await
    {
        Ok(true) => Ok(()),
        Ok(false) => {
            tracing::warn!(target: "approvers", "a passkey assertion whose counter did not move forward was refused (replayed, or a cloned authenticator)");
            Err(refuse(
                StatusCode::FORBIDDEN,
                "counter_went_back",
                "this passkey's signature counter did not move forward (an assertion used \
                 twice, or a copied authenticator): nothing was done",
            ))
        }
        Err(e) => Err(unavailable(&e)),
    }
}

async fn signin_finish(State(web): State<Arc<Web>>, body: Bytes) -> Response {
    let sent: SigninBody = match parse(&body) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let now = web.approvers.engine.now_ms();
    let Some(challenge) = answered_challenge(&sent.credential) else {
        return bad("malformed", "not a passkey assertion");
    };
    // Good once, on any replica: a replayed sign-in finds it gone.
    match web.approvers.records.take_challenge(&challenge, now).await {
        Ok(true) => {}
        Ok(false) => {
            return refuse(
                StatusCode::FORBIDDEN,
                "challenge_unknown",
                "this sign-in answers a challenge that was not ours, was used, or expired: sign \
                 in again",
            );
        }
        Err(e) => return unavailable(&e),
    }
    let passkey = match active_passkey(&web, &sent.credential).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let checked = match web
        .relying
        .check(&sent.credential, &passkey.credential, &challenge)
    {
        Ok(c) => c,
        Err(e) => return passkey_refused(&e),
    };
    if let Err(r) = count(&web, &checked).await {
        return r;
    }
    let session = Session {
        approver: passkey.approver.clone(),
        credential: passkey.credential_id,
        expires_at_ms: now.saturating_add(SESSION_MS),
    };
    let cookie = format!(
        "{COOKIE}={}; Path=/; Max-Age={}; HttpOnly; Secure; SameSite=Strict",
        session.cookie(&web.key),
        SESSION_MS / 1_000
    );
    tracing::info!(target: "approvers", approver = %passkey.approver, "signed in on the approvers' page");
    let mut response = json_response(StatusCode::OK, &json!({ "approver": passkey.approver }));
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

async fn signout() -> Response {
    let mut response = json_response(StatusCode::OK, &json!({ "signedOut": true }));
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "countersign_session=; Path=/; Max-Age=0; HttpOnly; Secure; SameSite=Strict",
        ),
    );
    response
}

/// The signed-in person, if the cookie is a live session of an approver who still counts.
async fn signed_in(web: &Web, headers: &HeaderMap) -> Result<Session, Response> {
    let out = || {
        refuse(
            StatusCode::UNAUTHORIZED,
            "signed_out",
            "sign in with your passkey",
        )
    };
    let now = web.approvers.engine.now_ms();
    let session = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .find_map(|value| Session::from_cookie(&web.key, value, now))
        .ok_or_else(out)?;
    // Checked against the roster on every use: a revoked passkey or approver has no session.
    match web.approvers.records.passkey(&session.credential).await {
        Ok(Some(p)) if p.is_active() && p.approver == session.approver => Ok(session),
        Ok(_) => Err(refuse(
            StatusCode::FORBIDDEN,
            "approver_revoked",
            "this passkey or approver was revoked: nothing it asks counts",
        )),
        Err(e) => Err(unavailable(&e)),
    }
}

async fn requests(State(web): State<Arc<Web>>, headers: HeaderMap) -> Response {
    let session = match signed_in(&web, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let a = &web.approvers;
    let now = a.engine.now_ms();
    let rows = match a.records.waiting_calls(&a.server, now).await {
        Ok(rows) => rows,
        Err(e) => return unavailable(&e),
    };
    let mut calls = Vec::with_capacity(rows.len());
    for row in rows {
        let by = match a.records.approved_by(&a.server, row.id, &row.plan).await {
            Ok(by) => by,
            Err(e) => return unavailable(&e),
        };
        if let Some(mut call) = view::call(&row, &by).or_else(|| view::change(&row, &by)) {
            call["seen"] = json!(seen_mark(&web.key, row.id, now));
            call["approvedByMe"] = json!(by.contains(&session.approver));
            calls.push(call);
        }
    }
    json_response(
        StatusCode::OK,
        &json!({
            "approver": session.approver,
            "approveDelayMs": web.approve_delay_ms,
            "calls": calls,
        }),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DecideBody {
    request: u64,
    verdict: String,
    #[serde(default)]
    typed: Option<String>,
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    seen: Option<String>,
    #[serde(default)]
    expires_at_ms: Option<u64>,
    #[serde(default)]
    credential: Option<Value>,
}

/// The decision on waiting call `row` as the server reads it (never as the page says it).
struct Read {
    row: WaitingCall,
    tool: String,
    target: String,
    class: GateClass,
    type_target: bool,
}

async fn waiting(web: &Web, request: u64, now: u64) -> Result<Read, Response> {
    let a = &web.approvers;
    let gone = || {
        refuse(
            StatusCode::NOT_FOUND,
            "not_pending",
            "no call with this number waits here (decided, withdrawn, or never asked)",
        )
    };
    let row = match a.records.waiting_call(request).await {
        Ok(Some(row))
            if row.server == a.server && row.verdict.is_none() && row.expires_at_ms > now =>
        {
            row
        }
        Ok(_) => return Err(gone()),
        Err(e) => return Err(unavailable(&e)),
    };
    let shown: Value = serde_json::from_str(&row.request).map_err(|_| gone())?;
    let (Some(tool), Some(target), Some(class)) = (
        shown["plan"]["tool"].as_str(),
        shown["plan"]["target"].as_str(),
        shown["asks"]["class"]
            .as_str()
            .and_then(GateClass::from_code),
    ) else {
        return Err(gone());
    };
    Ok(Read {
        tool: tool.to_owned(),
        target: target.to_owned(),
        class,
        type_target: shown["asks"]["type_target"].as_bool().unwrap_or(false),
        row,
    })
}

fn verdict(text: &str) -> Result<Verdict, Response> {
    match text {
        "approve" => Ok(Verdict::Approve),
        "deny" => Ok(Verdict::Deny),
        _ => Err(bad("malformed", "verdict is approve or deny")),
    }
}

/// Refuses an approval whose target policy asks typed and that was not typed as it is.
fn typed_right(read: &Read, verdict: Verdict, typed: Option<&str>) -> Result<(), Response> {
    if verdict == Verdict::Approve && read.type_target && typed != Some(read.target.as_str()) {
        return Err(refuse(
            StatusCode::CONFLICT,
            "target_mismatch",
            "type the target exactly as shown to approve this call",
        ));
    }
    Ok(())
}

async fn decide_begin(State(web): State<Arc<Web>>, headers: HeaderMap, body: Bytes) -> Response {
    let session = match signed_in(&web, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let sent: DecideBody = match parse(&body) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let verdict = match verdict(&sent.verdict) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let now = web.approvers.engine.now_ms();
    let read = match waiting(&web, sent.request, now).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    if let Err(r) = typed_right(&read, verdict, sent.typed.as_deref()) {
        return r;
    }
    let expires_at_ms = now.saturating_add(CHALLENGE_MS);
    let decision = Decision {
        server: &web.approvers.server,
        request: read.row.id,
        verdict,
        plan: &read.row.plan,
        tenant: &read.row.tenant,
        tool: &read.tool,
        target: &read.target,
        class: read.class,
        expires_at_ms,
    };
    let Some(challenge) = decision.passkey_challenge() else {
        return bad("malformed", "this call has no decision a passkey can sign");
    };
    // The signed-in person's passkeys only: the decision is theirs.
    let mine: Vec<Vec<u8>> = match web.approvers.records.passkeys().await {
        Ok(all) => all
            .into_iter()
            .filter(|p| p.is_active() && p.approver == session.approver)
            .map(|p| p.credential_id)
            .collect(),
        Err(e) => return unavailable(&e),
    };
    match web.relying.assertion_options(&challenge, &mine) {
        Ok(options) => json_response(
            StatusCode::OK,
            &json!({ "options": options, "expiresAtMs": expires_at_ms }),
        ),
        Err(e) => passkey_refused(&e),
    }
}

async fn decide_finish(State(web): State<Arc<Web>>, headers: HeaderMap, body: Bytes) -> Response {
    let session = match signed_in(&web, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let sent: DecideBody = match parse(&body) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let verdict = match verdict(&sent.verdict) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let (Some(expires_at_ms), Some(credential)) = (sent.expires_at_ms, sent.credential.as_ref())
    else {
        return refuse(
            StatusCode::FORBIDDEN,
            "unsigned",
            "a decision needs a fresh passkey assertion over it: nothing was decided",
        );
    };
    let note = sent.note.as_deref().map(str::trim).unwrap_or_default();
    if note.chars().count() > MAX_NOTE_CHARS {
        return bad("malformed", "a deny's note is at most 500 characters");
    }
    let now = web.approvers.engine.now_ms();
    if expires_at_ms <= now {
        return refuse(
            StatusCode::CONFLICT,
            "expired",
            "the decision expired: decide again",
        );
    }
    if expires_at_ms > now.saturating_add(MAX_DECISION_TTL_MS) {
        return bad(
            "expires_too_late",
            "a decision holds for at most 10 minutes: nothing was decided",
        );
    }
    let read = match waiting(&web, sent.request, now).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    if let Err(r) = typed_right(&read, verdict, sent.typed.as_deref()) {
        return r;
    }
    if verdict == Verdict::Approve {
        let shown_at = sent
            .seen
            .as_deref()
            .and_then(|mark| seen_at(&web.key, read.row.id, mark));
        match shown_at {
            Some(at) if now >= at.saturating_add(web.approve_delay_ms) => {}
            _ => {
                return refuse(
                    StatusCode::CONFLICT,
                    "too_soon",
                    "a call is approved only after it has been on the page for the approve delay: \
                     read it, then approve",
                );
            }
        }
    }
    let decision = Decision {
        server: &web.approvers.server,
        request: read.row.id,
        verdict,
        plan: &read.row.plan,
        tenant: &read.row.tenant,
        tool: &read.tool,
        target: &read.target,
        class: read.class,
        expires_at_ms,
    };
    let Some(challenge) = decision.passkey_challenge() else {
        return bad("malformed", "this call has no decision a passkey can sign");
    };
    let passkey = match active_passkey(&web, credential).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    if passkey.approver != session.approver {
        tracing::warn!(target: "approvers", approver = %session.approver, "a decision signed by another approver's passkey was refused");
        return refuse(
            StatusCode::FORBIDDEN,
            "another_approver",
            "this passkey is another approver's: a decision is signed by the person signed in",
        );
    }
    let checked = match web
        .relying
        .check(credential, &passkey.credential, &challenge)
    {
        Ok(c) => c,
        Err(e) => return passkey_refused(&e),
    };
    if let Err(r) = count(&web, &checked).await {
        return r;
    }
    web.approvers
        .accept(
            &session.approver,
            &decision,
            Evidence::Passkey(checked.assertion),
            note,
            now,
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_has_no_inline_script_or_style_and_never_parses_html() {
        // The policy forbids inline script and style; the page must not need them.
        let html = INDEX_HTML.to_ascii_lowercase();
        for tag in html.match_indices("<script").map(|(at, _)| &html[at..]) {
            let open = &tag[..tag.find('>').unwrap()];
            assert!(open.contains("src="), "an inline script: {open}");
        }
        assert!(!html.contains("<style"), "an inline style sheet");
        // Inside every tag: no style attribute, no event handler attribute (on…=).
        for tag in html
            .split('<')
            .skip(1)
            .map(|t| t.split('>').next().unwrap_or_default())
        {
            assert!(!tag.contains(" style="), "an inline style: <{tag}>");
            let handler = tag.split_whitespace().any(|attribute| {
                attribute.starts_with("on")
                    && attribute.split('=').next().is_some_and(|name| {
                        name.len() > 2 && name.chars().all(|c| c.is_ascii_alphabetic())
                    })
                    && attribute.contains('=')
            });
            assert!(!handler, "an inline event handler: <{tag}>");
        }
        // Strings reach the screen as text only.
        for script in [PAGE_JS, SHOWN_JS, PREVIEW_JS] {
            for sink in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
                "new Function",
                "Function(",
            ] {
                assert!(!script.contains(sink), "{sink} in the page's script");
            }
        }
    }

    #[test]
    fn the_policy_allows_only_the_pages_own_files_and_no_framing() {
        for part in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
            "form-action 'none'",
            "base-uri 'none'",
        ] {
            assert!(CSP.contains(part), "{part}");
        }
        assert!(!CSP.contains("unsafe"), "{CSP}");
    }

    #[test]
    fn an_invite_code_is_32_bytes_and_only_its_hash_is_kept() {
        let (code, hash) = new_invite();
        assert_eq!(invite_hash(&code), Some(hash));
        assert_ne!(code.as_bytes(), hash.as_slice());
        for bad in ["", "AAAA", "not base64!", &"A".repeat(44)] {
            assert_eq!(invite_hash(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_call_link_carries_the_number_and_nothing_else() {
        let origin = url::Url::parse("https://approve.example.com").unwrap();
        assert_eq!(
            call_link(&origin, 42),
            "https://approve.example.com/call/42"
        );
    }
}
