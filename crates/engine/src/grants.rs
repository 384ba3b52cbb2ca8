//! Grants: a person widens one approval so that later matching calls are approved without
//! another click, against approval fatigue, without giving the agent a way around the click.
//!
//! A grant exists only through [`Engine::approve_widening`], the window's Approve with a scope,
//! which passes every check of [`Engine::approve`] (the approve delay, the typed target) and
//! approves the request itself. No wire message, setting or file creates one: each stored grant
//! carries a MAC under a key derived from the signing secret, so a row written behind the desk's
//! back is ignored (and rotating the secret ends every grant).
//!
//! Two kinds:
//! - a call grant: the same server identity, tool and plan hash (tool, target, action, summary,
//!   details, reversible) for some minutes, on any connection to that server;
//! - a prefix grant: the tool, on targets under a path prefix, for one connection (it ends when
//!   the connection does, and a desk restart ends all of them).
//!
//! Caps, enforced here and not only in the window: at most [`MAX_GRANT_MINUTES`]; at most
//! [`MAX_LIVE_GRANTS`] live; never for a destructive tool (annotated `destructiveHint: true`, or
//! unannotated, which MCP reads the same) or one whose policy asks for its target typed, unless
//! the policy says `grants = true` for it. A grant covers a call only while the tool's definition
//! is the one pinned when it was made and its class is no stricter than then. Matching is exact:
//! prefixes compare whole path segments of text, so `/home/a` never covers `/home/ab`, and a
//! target (or prefix) with `.` or `..` segments, repeated or trailing separators, backslashes,
//! `%`, control, invisible or direction-changing characters is never covered, nor a call with
//! another argument named like a path (a move's destination) outside the prefix. Nothing is
//! normalised: a look-alike or another case is another path.
//!
//! A call a grant approves is answered at once with a token minted for it alone (a `once` tool's
//! token still works once), and history notes the grant, when it was made and that a click made
//! it. A revoke takes back every approval the grant made whose token has not expired (kept in
//! memory, at most [`MAX_GRANT_TOKENS`] unexpired per grant), so tokens collected while it lived
//! run nothing after it; those minted before a desk restart are not known to the next run.

use countersign_core::Tenant;
use serde::Serialize;

use countersign_core::policy::ToolRule;
use countersign_core::telemetry::{ConfirmEvent, EventKind};
use countersign_core::{GateClass, Plan, PlanHash, binding, render};
use countersign_store::{Grant, GrantEnd, GrantKind, StoreError};
use serde_json::{Map, Value};

use crate::answer::{Approved, Stopped};
use crate::approve::{ApproveError, issued};
use crate::authority::{Engine, lock, outage};
use crate::queue::{CallRequest, PendingRequest};

/// The longest a grant lives: eight hours.
pub const MAX_GRANT_MINUTES: u64 = 8 * 60;

/// The most grants live at once.
pub const MAX_LIVE_GRANTS: usize = 64;

/// The fewest path segments a prefix has (`/home/a` has two): a prefix of `/` or one directory
/// covers too much to be one person's considered choice.
pub const MIN_PREFIX_SEGMENTS: usize = 2;

/// The most unexpired tokens one grant keeps minted: past it, a call it covers waits for a click
/// (each is remembered so that a revoke can take it back).
pub const MAX_GRANT_TOKENS: usize = 4096;

/// The longest prefix or target a prefix grant considers, in characters.
pub const MAX_PATH_CHARS: usize = 1024;

/// What a person asks for beside Approve.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Widening {
    /// This same call, for `minutes`.
    Call {
        /// How long, 1 to [`MAX_GRANT_MINUTES`].
        minutes: u64,
    },
    /// This tool on targets under `prefix`, for this connection, for at most `minutes`.
    Prefix {
        /// The prefix: whole path segments, at least [`MIN_PREFIX_SEGMENTS`].
        prefix: String,
        /// How long at most, 1 to [`MAX_GRANT_MINUTES`].
        minutes: u64,
    },
}

/// Why a path cannot be a grant's prefix or be covered by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// Longer than [`MAX_PATH_CHARS`].
    #[error("longer than {MAX_PATH_CHARS} characters")]
    TooLong,
    /// Holds a control, invisible or direction-changing character, a backslash or `%`.
    #[error("holds a control, invisible or direction-changing character, a backslash or '%'")]
    Character,
    /// Has an empty segment (`//`, or a trailing `/`), or a `.` or `..` segment.
    #[error("has an empty, '.' or '..' segment")]
    Segment,
    /// Fewer than [`MIN_PREFIX_SEGMENTS`] segments (a prefix only).
    #[error("has fewer than {MIN_PREFIX_SEGMENTS} segments")]
    TooShort,
}

/// Why a widening was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    /// Nothing was approved: the approval itself was refused (delay, typed target, secret...).
    #[error(transparent)]
    Approve(#[from] ApproveError),
    /// A change to the desk is decided one by one, never widened.
    #[error("a change to the desk cannot be widened into a grant")]
    Change,
    /// The tool is destructive and the policy does not allow grants for it.
    #[error(
        "the tool is destructive (destructiveHint, or no annotation saying otherwise): grants are refused unless the policy sets grants = true for it"
    )]
    Destructive,
    /// The policy asks for the target typed on every approval of this tool.
    #[error(
        "the policy asks for the target typed on each approval of this tool: grants are refused unless the policy sets grants = true for it"
    )]
    TypedTarget,
    /// The connection no longer lists the tool as the request showed it (changed, gone).
    #[error("the tool is no longer listed as it was when the request arrived")]
    ToolChanged,
    /// The duration is not 1 to [`MAX_GRANT_MINUTES`] minutes.
    #[error("a grant lasts 1 to {MAX_GRANT_MINUTES} minutes")]
    Duration,
    /// The prefix is not one a grant may have.
    #[error("the prefix {0}")]
    Prefix(PathError),
    /// The request's own target cannot be covered by a prefix.
    #[error("the target {0}, so no prefix can cover it")]
    Target(PathError),
    /// The prefix does not cover the request's target.
    #[error("the prefix does not cover this request's target (whole segments, exactly)")]
    NotUnder,
    /// [`MAX_LIVE_GRANTS`] grants live already.
    #[error("{MAX_LIVE_GRANTS} grants live already: revoke one first")]
    TooMany,
    /// The request was approved, but the grant could not be stored: later calls ask again.
    #[error("approved, but the grant could not be stored ({0}): later calls ask again")]
    NotStored(String),
    /// No live grant has this number.
    #[error("no live grant has this number")]
    NoSuchGrant,
    /// The rules over arguments gate this call and no rule of them says a grant may cover it
    /// (`@grant_max_minutes`).
    #[error(
        "the desk's rules over arguments gate this call and none of them allows a grant (@grant_max_minutes)"
    )]
    Ruled,
    /// Longer than the rules allow a grant of this call.
    #[error("the desk's rules allow a grant of this call for at most {0} minutes")]
    LongerThanRules(u64),
}

impl GrantError {
    /// A stable code for the UI.
    pub fn code(&self) -> &'static str {
        match self {
            GrantError::Approve(e) => e.code(),
            GrantError::Change => "change_not_grantable",
            GrantError::Destructive => "destructive",
            GrantError::TypedTarget => "typed_target",
            GrantError::ToolChanged => "tool_changed",
            GrantError::Duration => "bad_duration",
            GrantError::Prefix(_) => "bad_prefix",
            GrantError::Target(_) => "bad_target",
            GrantError::NotUnder => "not_under_prefix",
            GrantError::TooMany => "too_many_grants",
            GrantError::NotStored(_) => "grant_not_stored",
            GrantError::NoSuchGrant => "no_such_grant",
            GrantError::Ruled => "ruled_not_grantable",
            GrantError::LongerThanRules(_) => "longer_than_rules",
        }
    }
}

/// What the rules over arguments allow a grant covering a call they gate.
pub(crate) struct RuledGrant {
    /// The longest a covering grant may last (`@grant_max_minutes`).
    pub(crate) max_minutes: u64,
    /// The class the rules give the call.
    pub(crate) class: GateClass,
    /// How many people the rules ask for it.
    pub(crate) approvers: u8,
}

/// What the window may offer beside Approve for one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrantOffer {
    /// Whether a call grant may be made from it.
    pub call: bool,
    /// Why not, as a code, when it may not.
    pub call_code: Option<&'static str>,
    /// Why not, for the person.
    pub call_why: Option<String>,
    /// Whether a prefix grant may be made from it.
    pub prefix: bool,
    /// Why not, as a code.
    pub prefix_code: Option<&'static str>,
    /// Why not, for the person.
    pub prefix_why: Option<String>,
    /// The prefix proposed: the target's parent directory, when that is a valid prefix.
    pub default_prefix: Option<String>,
    /// The longest grant, in minutes.
    pub max_minutes: u64,
}

/// The segments of `path` if it is one a grant may compare: absolute or not, no empty, `.` or
/// `..` segment, nothing invisible or odd.
pub fn segments(path: &str) -> Result<Vec<&str>, PathError> {
    if path.chars().nth(MAX_PATH_CHARS).is_some() {
        return Err(PathError::TooLong);
    }
    if path
        .chars()
        .any(|c| c.is_control() || render::is_deceptive(c) || c == '\\' || c == '%')
    {
        return Err(PathError::Character);
    }
    let rest = path.strip_prefix('/').unwrap_or(path);
    let parts: Vec<&str> = rest.split('/').collect();
    if parts
        .iter()
        .any(|s| s.is_empty() || *s == "." || *s == "..")
    {
        return Err(PathError::Segment);
    }
    Ok(parts)
}

/// Whether `prefix` may be a grant's prefix.
pub fn check_prefix(prefix: &str) -> Result<(), PathError> {
    if segments(prefix)?.len() < MIN_PREFIX_SEGMENTS {
        return Err(PathError::TooShort);
    }
    Ok(())
}

/// Whether `target` is under `prefix` (or is it), segment by segment, both valid.
pub fn is_under(target: &str, prefix: &str) -> bool {
    if check_prefix(prefix).is_err() || prefix.starts_with('/') != target.starts_with('/') {
        return false;
    }
    match (segments(target), segments(prefix)) {
        (Ok(t), Ok(p)) => t.len() >= p.len() && t.iter().zip(&p).all(|(a, b)| a == b),
        _ => false,
    }
}

/// Whether an argument's name says it holds a path (or paths): `path`, `paths`, `new_path`,
/// `oldPath`, `dir`, `directory`, `source`, `destination`, `file`, `from`, `to`, `uri`, `url`...,
/// and any name with a word among them (`file_name`, `fileName`, `outputFolder`, `src_dir`).
fn names_a_path(name: &str) -> bool {
    let plain: String = name
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .collect::<String>()
        .to_lowercase();
    [
        "path",
        "paths",
        "dir",
        "dirs",
        "directory",
        "directories",
        "file",
        "files",
    ]
    .iter()
    .any(|end| plain.ends_with(end))
        || [
            "source",
            "sources",
            "destination",
            "dest",
            "from",
            "to",
            "src",
            "dst",
            "target",
            "uri",
            "url",
            "root",
            "cwd",
            "location",
        ]
        .contains(&plain.as_str())
        || words(name).iter().any(|word| {
            [
                "path",
                "paths",
                "filepath",
                "filepaths",
                "file",
                "files",
                "filename",
                "filenames",
                "dir",
                "dirs",
                "dirname",
                "directory",
                "directories",
                "folder",
                "folders",
                "source",
                "sources",
                "destination",
                "dest",
                "src",
                "dst",
            ]
            .contains(&word.as_str())
        })
}

/// The words of an argument's name, lower case: split at `_`, `-`, `.`, spaces and where a
/// capital follows a small letter or digit (`outputFolder` is `output`, `folder`).
fn words(name: &str) -> Vec<String> {
    let mut words = vec![String::new()];
    let mut previous_small = false;
    for c in name.chars() {
        if c == '_' || c == '-' || c == '.' || c.is_whitespace() {
            words.push(String::new());
            previous_small = false;
            continue;
        }
        if c.is_uppercase() && previous_small {
            words.push(String::new());
        }
        previous_small = c.is_lowercase() || c.is_ascii_digit();
        if let Some(word) = words.last_mut() {
            word.extend(c.to_lowercase());
        }
    }
    words.retain(|w| !w.is_empty());
    words
}

/// How deep in the arguments a prefix grant looks for paths; anything deeper is not covered.
const MAX_PATH_DEPTH: usize = 16;

/// Whether every argument of a call that names a path is under `prefix` (a string under it, or
/// an array of strings each under it): a prefix grant must not let a second path argument (a
/// move's destination, a copy's source) go anywhere. Nested objects are read the same way at
/// every depth (`items[].path`, `options.backup.dest`): the upstream receives them as they are.
/// An argument named like a path holding anything else is not covered, nor arguments nested
/// deeper than [`MAX_PATH_DEPTH`].
pub fn paths_under(arguments: &Map<String, Value>, prefix: &str) -> bool {
    object_paths_under(arguments, prefix, 0)
}

fn object_paths_under(object: &Map<String, Value>, prefix: &str, depth: usize) -> bool {
    object.iter().all(|(name, value)| {
        if names_a_path(name) {
            match value {
                Value::String(s) => is_under(s, prefix),
                Value::Array(items) => items
                    .iter()
                    .all(|v| v.as_str().is_some_and(|s| is_under(s, prefix))),
                _ => false,
            }
        } else {
            nested_paths_under(value, prefix, depth + 1)
        }
    })
}

/// Whether the paths named inside `value` (an argument not itself named like a path) are under
/// `prefix`.
fn nested_paths_under(value: &Value, prefix: &str, depth: usize) -> bool {
    match value {
        Value::Object(object) => {
            depth <= MAX_PATH_DEPTH && object_paths_under(object, prefix, depth)
        }
        Value::Array(items) => {
            depth <= MAX_PATH_DEPTH
                && items
                    .iter()
                    .all(|item| nested_paths_under(item, prefix, depth + 1))
        }
        _ => true,
    }
}

/// The parent directory of `target`, if it is a valid prefix.
pub fn default_prefix(target: &str) -> Option<String> {
    segments(target).ok()?;
    let (parent, _) = target.rsplit_once('/')?;
    check_prefix(parent).ok()?;
    Some(parent.to_owned())
}

/// Whether `rule` lets a person widen an approval of its tool at all.
pub fn grantable(rule: &ToolRule) -> Result<(), GrantError> {
    if rule.grants {
        Ok(())
    } else if rule.destructive {
        Err(GrantError::Destructive)
    } else if rule.type_target {
        Err(GrantError::TypedTarget)
    } else {
        Ok(())
    }
}

/// `ms` since the epoch as `2026-12-01 12:01:02 UTC`.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Everything that decides what `grant` covers, as its MAC covers it: each field ends in a
/// newline or carries its length, so no two grants encode alike.
fn scope_text(grant: &Grant) -> String {
    let field = |s: Option<&str>| match s {
        Some(s) => format!("{}:{s}\n", s.len()),
        None => "-\n".to_owned(),
    };
    format!(
        "v1\n{}\n{}{}{}{}\n{}{}\n{}\n{}\n{}\n{}\n",
        grant.kind.code(),
        field(Some(&grant.server)),
        field(Some(&grant.tool)),
        field(grant.tenant.as_deref()),
        grant.plan.map(|p| p.to_hex()).unwrap_or_default(),
        field(grant.prefix.as_deref()),
        grant.class.code(),
        grant.definition.to_hex(),
        grant.request,
        grant.granted_at_ms,
        grant.expires_at_ms,
    )
}

/// A call as a grant may cover it.
struct Covered<'a> {
    server: &'a str,
    tenant: &'a str,
    tool: &'a str,
    target: &'a str,
    arguments: &'a Map<String, Value>,
    plan: PlanHash,
    class: GateClass,
    definition: PlanHash,
    now: u64,
}

/// Whether `grant` (read from the file, its MAC checked by the caller) covers `call`.
fn covers(grant: &Grant, call: &Covered<'_>) -> bool {
    let fresh = grant.ended.is_none()
        && grant.expires_at_ms > call.now
        && grant.granted_at_ms <= call.now
        && grant.expires_at_ms - grant.granted_at_ms <= MAX_GRANT_MINUTES * 60_000;
    // A class stricter now than when the grant was made (token then, once now) is not covered.
    let class_ok = !call.class.is_single_use() || grant.class.is_single_use();
    let scope_ok = match grant.kind {
        GrantKind::Call => grant.plan == Some(call.plan),
        GrantKind::Prefix => {
            grant.tenant.as_deref() == Some(call.tenant)
                && grant
                    .prefix
                    .as_deref()
                    .is_some_and(|p| is_under(call.target, p) && paths_under(call.arguments, p))
        }
    };
    fresh
        && class_ok
        && scope_ok
        && grant.server == call.server
        && grant.tool == call.tool
        && grant.definition == call.definition
}

impl Engine {
    /// The grants' turn (see `Inner::grants_turn`), with the session grants of an earlier run
    /// of the desk ended first (once per engine): their connections are gone, whatever the
    /// records say.
    pub(crate) async fn grants_turn(&self) -> tokio::sync::MutexGuard<'_, bool> {
        let mut ended = self.inner.grants_turn.lock().await;
        if !*ended {
            match self
                .records()
                .end_prefix_grants(None, self.now(), GrantEnd::Restarted)
                .await
            {
                Ok(_) => *ended = true,
                Err(e) => {
                    tracing::warn!(target: "desk", error = %e, "could not end the session grants of an earlier run (they cover nothing: their connections are gone)")
                }
            }
        }
        ended
    }

    /// The rule, definition hash and server of `tool` as connection `tenant` lists it, if its
    /// definition is the pinned one.
    pub(crate) fn listed_rule(
        &self,
        tenant: &Tenant,
        tool: &str,
    ) -> Option<(ToolRule, PlanHash, String)> {
        let state = lock(&self.inner.state);
        let conn = state.connections.get(tenant)?;
        let listed = conn.tools.get(tool).filter(|l| l.pinned)?;
        Some((listed.rule.clone(), listed.hash, conn.server.clone()))
    }

    /// What the window may offer beside Approve for request `id` (`None`: not waiting).
    pub fn grant_offer(&self, id: u64) -> Option<GrantOffer> {
        let view = {
            let state = lock(&self.inner.state);
            let entry = state.requests.get(&id).filter(|e| e.is_waiting())?;
            entry.view.clone()
        };
        let widenable = self.widenable(&view);
        let most = match &widenable {
            Ok((_, _, call)) => call.grant_max_minutes.unwrap_or(MAX_GRANT_MINUTES),
            Err(_) => MAX_GRANT_MINUTES,
        };
        let general = widenable.err();
        let prefix = match &general {
            Some(e) => Err(e.clone()),
            None => match segments(&view.plan.target) {
                Err(e) => Err(GrantError::Target(e)),
                Ok(_) => {
                    default_prefix(&view.plan.target).ok_or(GrantError::Target(PathError::TooShort))
                }
            },
        };
        Some(GrantOffer {
            call: general.is_none(),
            call_code: general.as_ref().map(GrantError::code),
            call_why: general.as_ref().map(ToString::to_string),
            prefix: prefix.is_ok(),
            prefix_code: prefix.as_ref().err().map(GrantError::code),
            prefix_why: prefix.as_ref().err().map(ToString::to_string),
            default_prefix: prefix.ok(),
            max_minutes: most.min(MAX_GRANT_MINUTES),
        })
    }

    /// Whether the request `view` may be widened at all, under its tool's rule now.
    pub(crate) fn widenable(
        &self,
        view: &PendingRequest,
    ) -> Result<(ToolRule, PlanHash, CallRequest), GrantError> {
        let call = view.call().ok_or(GrantError::Change)?;
        let (rule, definition, server) = self
            .listed_rule(&call.tenant, &view.plan.tool)
            .ok_or(GrantError::ToolChanged)?;
        if server != call.server || (!call.ruled && rule.class != call.class) {
            return Err(GrantError::ToolChanged);
        }
        if call.ruled && call.grant_max_minutes.is_none() {
            return Err(GrantError::Ruled);
        }
        grantable(&rule)?;
        Ok((rule, definition, call.clone()))
    }

    /// A person clicked Approve with a widening: request `id` is approved exactly as
    /// [`Engine::approve`] approves it (same delay, same typed target), and then a grant is made
    /// for later calls it covers. Refused before anything is approved when the widening is not
    /// allowed. Answers the grant's number.
    pub async fn approve_widening(
        &self,
        id: u64,
        typed_target: Option<&str>,
        widening: &Widening,
    ) -> Result<u64, GrantError> {
        let view = {
            let state = lock(&self.inner.state);
            let entry = state
                .requests
                .get(&id)
                .filter(|e| e.is_waiting() && !e.approving)
                .ok_or(ApproveError::NotPending)?;
            entry.view.clone()
        };
        let (_, definition, call) = self.widenable(&view)?;
        let (kind, minutes, prefix) = match widening {
            Widening::Call { minutes } => (GrantKind::Call, *minutes, None),
            Widening::Prefix { prefix, minutes } => {
                check_prefix(prefix).map_err(GrantError::Prefix)?;
                segments(&view.plan.target).map_err(GrantError::Target)?;
                let arguments = lock(&self.inner.state)
                    .requests
                    .get(&id)
                    .and_then(|e| e.arguments().cloned())
                    .unwrap_or_default();
                if !is_under(&view.plan.target, prefix) || !paths_under(&arguments, prefix) {
                    return Err(GrantError::NotUnder);
                }
                (GrantKind::Prefix, *minutes, Some(prefix.clone()))
            }
        };
        if !(1..=MAX_GRANT_MINUTES).contains(&minutes) {
            return Err(GrantError::Duration);
        }
        if let Some(most) = call.grant_max_minutes
            && minutes > most
        {
            return Err(GrantError::LongerThanRules(most));
        }
        let key = self.key().map_err(|no| ApproveError::NoSecret(no.why))?;
        let now = self.now();
        let live = {
            let _turn = self.grants_turn().await;
            self.records()
                .live_grants(now)
                .await
                .map_err(|e| ApproveError::Store(e.to_string()))?
        };
        if live.len() >= MAX_LIVE_GRANTS {
            return Err(GrantError::TooMany);
        }
        // The click itself: every check of a plain approve, and the approval of this request.
        self.approve(id, typed_target).await?;
        let now = self.now();
        let mut grant = Grant {
            id: 0,
            kind,
            server: call.server.clone(),
            tool: view.plan.tool.clone(),
            tenant: (kind == GrantKind::Prefix).then(|| call.tenant.to_string()),
            plan: (kind == GrantKind::Call).then_some(call.plan_hash),
            prefix,
            target: view.plan.target.clone(),
            summary: view.plan.summary.clone(),
            class: call.class,
            definition,
            request: id,
            granted_at_ms: now,
            expires_at_ms: now + minutes * 60_000,
            uses: 0,
            ended: None,
            mac: [0; 32],
        };
        grant.mac = binding::grant_mac(&key, &scope_text(&grant));
        let stored = {
            let _turn = self.grants_turn().await;
            self.records().put_grant(&grant, MAX_LIVE_GRANTS, now).await
        };
        let number = match stored {
            Ok(Some(number)) => number,
            Ok(None) => return Err(GrantError::TooMany),
            Err(e) => return Err(GrantError::NotStored(e.to_string())),
        };
        let scope = match &grant.prefix {
            Some(prefix) => format!("on targets under {prefix} for this connection"),
            None => "for this same call".to_owned(),
        };
        self.record(ConfirmEvent {
            at_ms: now,
            kind: EventKind::Changed,
            tool: "change:grant".to_owned(),
            target: Some(grant.target.clone()),
            tenant: call.tenant.to_string(),
            nonce: None,
            plan: Some(call.plan_hash),
            note: Some(format!(
                "grant #{number}: {} {scope}, {minutes} minutes, by a click on request #{id}",
                grant.tool
            )),
        })
        .await;
        Ok(number)
    }

    /// The grants live now, oldest first: not ended, not expired, carrying their MAC, and for a
    /// session grant, its connection still here.
    pub async fn grants(&self) -> Result<Vec<Grant>, StoreError> {
        let key = self.key().ok();
        let now = self.now();
        let live = {
            let _turn = self.grants_turn().await;
            self.records().live_grants(now).await?
        };
        let state = lock(&self.inner.state);
        Ok(live
            .into_iter()
            .filter(|g| {
                key.as_ref()
                    .is_some_and(|k| binding::grant_mac_matches(k, &scope_text(g), &g.mac))
            })
            .filter(|g| match &g.tenant {
                Some(t) => state.connections.contains_key(t.as_str()),
                None => true,
            })
            .collect())
    }

    /// A person clicked Revoke on grant `number`: the next call it would have covered waits for
    /// a click again.
    pub async fn revoke_grant(&self, number: u64) -> Result<(), GrantError> {
        let now = self.now();
        let turn = self.grants_turn().await;
        let ended = self
            .records()
            .end_grant(number, now, GrantEnd::Revoked)
            .await
            .map_err(|e| GrantError::NotStored(e.to_string()))?;
        if !ended {
            return Err(GrantError::NoSuchGrant);
        }
        // What it approved without a click and has not run yet is taken back: a token collected
        // while it lived executes nothing after the revoke (the click's own approval stays).
        let minted = lock(&self.inner.state)
            .grant_tokens
            .remove(&number)
            .unwrap_or_default();
        for (nonce, exp) in minted {
            if exp > now
                && let Err(e) = self.records().withdraw_approval(&nonce).await
            {
                tracing::error!(target: "desk", grant = number, error = %e, "could not take back an approval of a revoked grant");
            }
        }
        drop(turn);
        self.record(ConfirmEvent {
            at_ms: now,
            kind: EventKind::Changed,
            tool: "change:grant".to_owned(),
            target: None,
            tenant: String::new(),
            nonce: None,
            plan: None,
            note: Some(format!("grant #{number} revoked by a click")),
        })
        .await;
        Ok(())
    }

    /// The agent's own `clientInfo` on connection `tenant` while it is connected: shown beside a
    /// session grant, never used to decide anything.
    pub fn client_info_of(&self, tenant: &Tenant) -> Option<Value> {
        lock(&self.inner.state)
            .connections
            .get(tenant)
            .map(|c| c.client_info.clone())
    }

    /// Connection `tenant` went away: its session grants end with it.
    pub(crate) async fn end_session_grants(&self, tenant: &Tenant) {
        let _turn = self.grants_turn().await;
        let ended = self
            .records()
            .end_prefix_grants(Some(tenant.as_str()), self.now(), GrantEnd::Disconnected)
            .await;
        if let Err(e) = ended {
            // They cover nothing anyway: matching needs the tenant, which is never reused.
            tracing::warn!(target: "desk", error = %e, "could not record the end of a connection's grants");
        }
    }

    /// The answer to a preflight a live grant covers (a token minted for this call alone), or
    /// `Ok(None)`: it waits for a click as usual. Any doubt about a grant (no secret, a MAC that
    /// does not match, a mint that failed) is `Ok(None)`. Grants that cannot be read are an
    /// outage, never "no grant": refused `ledger_unreachable`, the call neither approved nor
    /// queued (the person would be asked for what a grant of theirs may cover).
    pub(crate) async fn granted(
        &self,
        tenant: &Tenant,
        plan: &Plan,
        hash: PlanHash,
        arguments: &Map<String, Value>,
        budgets: &[countersign_cedar::Budget],
        ruled: Option<&RuledGrant>,
    ) -> Result<Option<Approved>, Stopped> {
        let Some((rule, definition, server)) = self.listed_rule(tenant, &plan.tool) else {
            return Ok(None);
        };
        if grantable(&rule).is_err() {
            return Ok(None);
        }
        let Ok(key) = self.key() else {
            return Ok(None);
        };
        let now = self.now();
        let call = Covered {
            server: &server,
            tenant: tenant.as_str(),
            tool: &plan.tool,
            target: &plan.target,
            arguments,
            plan: hash,
            class: rule.class,
            definition,
            now,
        };
        // The grants' turn is held from the read of the grant through the mint: a revoke waits
        // for it, and a revoke that went first is seen.
        let turn = self.grants_turn().await;
        let live = match self.records().live_grants(now).await {
            Ok(live) => live,
            Err(e) => {
                tracing::warn!(target: "desk", error = %e, "grants unreadable: the call is refused ledger_unreachable");
                return Err(outage());
            }
        };
        let Some(grant) = live
            .into_iter()
            .find(|g| covers(g, &call) && binding::grant_mac_matches(&key, &scope_text(g), &g.mac))
        else {
            return Ok(None);
        };
        // Its connection must still be here (a session grant outliving it covers nothing), and
        // the tokens it keeps minted are bounded.
        {
            let mut state = lock(&self.inner.state);
            if grant.tenant.is_some() && !state.connections.contains_key(tenant) {
                return Ok(None);
            }
            if state.grant_tokens.len() > MAX_LIVE_GRANTS {
                state.grant_tokens.retain(|_, minted| {
                    minted.retain(|(_, exp)| *exp > now);
                    !minted.is_empty()
                });
            }
            let minted = state.grant_tokens.entry(grant.id).or_default();
            minted.retain(|(_, exp)| *exp > now);
            if minted.len() >= MAX_GRANT_TOKENS {
                tracing::warn!(target: "desk", grant = grant.id, "a grant has {MAX_GRANT_TOKENS} unexpired tokens: the call waits for a click");
                return Ok(None);
            }
        }
        // A call the rules gate is covered only by a grant within what they say: no longer than
        // their longest grant, of a class at least theirs, and never where they ask more than
        // one person (a grant is one person's click).
        if let Some(ruled) = ruled {
            let strictness = |c: GateClass| match c {
                GateClass::Open => 0,
                GateClass::Token => 1,
                GateClass::Once => 2,
            };
            let lasts = grant.expires_at_ms.saturating_sub(grant.granted_at_ms);
            if ruled.approvers > 1
                || lasts > ruled.max_minutes.saturating_mul(60_000)
                || strictness(ruled.class) > strictness(grant.class)
            {
                return Ok(None);
            }
        }
        // The rules' budgets count what runs without a click, a grant's calls too: past one,
        // the call waits for a click (or is refused where the rule says).
        if let Some(spent) = self
            .take_budgets(tenant, &server, &plan.tool, budgets, Some(grant.id))
            .await?
        {
            if spent.refuse {
                return Err(crate::ruling::budget_spent(&spent, now));
            }
            tracing::info!(target: "desk", grant = grant.id, line = spent.line, "a rule's budget is used up: the granted call waits for a click");
            return Ok(None);
        }
        let minted = self
            .mint(&key, tenant, plan, hash, rule.class, arguments.clone(), now)
            .await;
        let (answer, claims) = match minted {
            Ok(minted) => minted,
            Err(e) => {
                tracing::warn!(target: "desk", error = %e, "a grant's call could not be approved: it waits for a click");
                return Ok(None);
            }
        };
        if let Err(e) = self.records().grant_used(grant.id).await {
            tracing::warn!(target: "desk", error = %e, "could not count a grant's use");
        }
        // Remembered before the turn is let go: a revoke waiting for it sees this token too.
        lock(&self.inner.state)
            .grant_tokens
            .entry(grant.id)
            .or_default()
            .push((claims.nonce, claims.exp));
        drop(turn);
        let note = format!(
            "by grant #{}, granted at {} by a click",
            grant.id,
            utc(grant.granted_at_ms)
        );
        self.record(issued(claims, now, Some(note))).await;
        Ok(Some(answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use countersign_core::policy::Policy;

    #[test]
    pub(crate) fn a_prefix_covers_whole_segments_only() {
        assert!(is_under("/home/a/docs/x.txt", "/home/a"));
        assert!(is_under("/home/a", "/home/a"));
        assert!(!is_under("/home/ab", "/home/a"));
        assert!(!is_under("/home/ab/x", "/home/a"));
        assert!(!is_under("/home", "/home/a"));
        // Relative and absolute never cover each other.
        assert!(!is_under("home/a/x", "/home/a"));
        assert!(!is_under("/home/a/x", "home/a"));
        assert!(is_under("owner/repo/issues", "owner/repo"));
    }

    #[test]
    pub(crate) fn traversal_and_odd_segments_are_never_covered() {
        for target in [
            "/home/a/../b",
            "/home/a/./x",
            "/home/a//x",
            "/home/a/x/",
            "/home/a/..",
            "/home/a/x\u{0}y",
            "/home/a/\u{202e}txt.exe",
            "/home/a/x\u{200b}",
            "/home/a/%2e%2e/b",
            "/home/a\\..\\b",
            "/home/a/x\ny",
        ] {
            assert!(!is_under(target, "/home/a"), "{target:?}");
        }
        let long = format!("/home/a/{}", "x".repeat(MAX_PATH_CHARS));
        assert!(!is_under(&long, "/home/a"));
    }

    #[test]
    pub(crate) fn look_alikes_and_other_cases_are_other_paths() {
        // Cyrillic а (U+0430) for Latin a.
        assert!(!is_under("/home/\u{430}/x", "/home/a"));
        assert!(!is_under("/HOME/a/x", "/home/a"));
        // Composed é and e with a combining accent are different text: no normalising.
        assert!(!is_under("/home/caf\u{65}\u{301}/x", "/home/caf\u{e9}"));
    }

    #[test]
    pub(crate) fn a_prefix_needs_two_segments_and_no_oddities() {
        for prefix in [
            "",
            "/",
            "/home",
            "home",
            "/home/",
            "//home/a",
            "/home/a/",
            "/home/./a",
        ] {
            assert!(check_prefix(prefix).is_err(), "{prefix:?}");
        }
        assert_eq!(check_prefix("/home"), Err(PathError::TooShort));
        assert_eq!(check_prefix("/home/../a"), Err(PathError::Segment));
        assert_eq!(check_prefix("/home/\u{202e}a"), Err(PathError::Character));
        assert!(check_prefix("/home/a").is_ok());
        assert!(check_prefix("owner/repo").is_ok());
    }

    #[test]
    pub(crate) fn every_argument_naming_a_path_must_be_under_the_prefix_too() {
        let args = |v: Value| v.as_object().unwrap().clone();
        let ok = args(serde_json::json!({
            "source": "/home/a/x", "destination": "/home/a/y", "content": "/etc/passwd",
            "paths": ["/home/a/1", "/home/a/2"], "count": 3
        }));
        assert!(paths_under(&ok, "/home/a"));
        // Words that only contain a path word's letters are not paths.
        let plain = args(serde_json::json!({"direction": "up", "filter": "*.md",
            "items": [{"content": "/etc/passwd", "path": "/home/a/n"}]}));
        assert!(paths_under(&plain, "/home/a"));
        // Too deep to read is not covered.
        let mut deep = serde_json::json!({"path": "/home/a/x"});
        for _ in 0..=MAX_PATH_DEPTH {
            deep = serde_json::json!({ "nested": deep });
        }
        assert!(!paths_under(&args(deep), "/home/a"));
        for bad in [
            serde_json::json!({"source": "/home/a/x", "destination": "/etc/cron.d/x"}),
            serde_json::json!({"new_path": "/home/a/../../etc"}),
            serde_json::json!({"newPath": "/elsewhere/x"}),
            serde_json::json!({"paths": ["/home/a/1", "/etc/2"]}),
            serde_json::json!({"paths": ["/home/a/1", 2]}),
            serde_json::json!({"to": {"path": "/home/a/x"}}),
            serde_json::json!({"Dest-Dir": "relative/x"}),
            serde_json::json!({"items": [{"path": "/etc/x"}]}),
            serde_json::json!({"options": {"backup": {"dest": "/etc/x"}}}),
            serde_json::json!({"file_name": "../../etc/passwd"}),
            serde_json::json!({"fileName": "/etc/passwd"}),
            serde_json::json!({"outputFolder": "/etc"}),
            serde_json::json!({"list": [[{"src_dir": "/etc"}]]}),
        ] {
            assert!(!paths_under(&args(bad.clone()), "/home/a"), "{bad}");
        }
    }

    #[test]
    pub(crate) fn the_default_prefix_is_the_parent_directory_when_that_is_a_valid_prefix() {
        assert_eq!(
            default_prefix("/home/a/docs/x.txt").as_deref(),
            Some("/home/a/docs")
        );
        assert_eq!(default_prefix("/home/a").as_deref(), None);
        assert_eq!(default_prefix("nightly"), None);
        assert_eq!(default_prefix("/home/a/../x"), None);
    }

    #[test]
    pub(crate) fn destructive_or_typed_target_tools_are_grantable_only_by_policy() {
        let rule = |destructive, type_target, grants| {
            let mut rule = Policy::default().rule("s", &serde_json::json!({"name": "t"}));
            rule.destructive = destructive;
            rule.type_target = type_target;
            rule.grants = grants;
            rule
        };
        assert_eq!(grantable(&rule(false, false, false)), Ok(()));
        assert_eq!(
            grantable(&rule(true, true, false)),
            Err(GrantError::Destructive)
        );
        assert_eq!(
            grantable(&rule(false, true, false)),
            Err(GrantError::TypedTarget)
        );
        assert_eq!(grantable(&rule(true, true, true)), Ok(()));
    }

    #[test]
    pub(crate) fn times_read_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_796_126_462_000), "2026-12-01 12:01:02 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }

    pub(crate) fn grant() -> Grant {
        Grant {
            id: 1,
            kind: GrantKind::Prefix,
            server: "fs".into(),
            tool: "write_file".into(),
            tenant: Some("conn-1".into()),
            plan: None,
            prefix: Some("/home/a".into()),
            target: "/home/a/x".into(),
            summary: String::new(),
            class: GateClass::Token,
            definition: PlanHash::from_bytes([1; 32]),
            request: 3,
            granted_at_ms: 1_000,
            expires_at_ms: 61_000,
            uses: 0,
            ended: None,
            mac: [0; 32],
        }
    }

    pub(crate) fn call<'a>(target: &'a str, class: GateClass, now: u64) -> Covered<'a> {
        static NONE: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        Covered {
            server: "fs",
            tenant: "conn-1",
            tool: "write_file",
            target,
            arguments: NONE.get_or_init(Map::new),
            plan: PlanHash::from_bytes([2; 32]),
            class,
            definition: PlanHash::from_bytes([1; 32]),
            now,
        }
    }

    #[test]
    pub(crate) fn a_grant_covers_nothing_past_its_expiry_under_a_stricter_class_or_a_changed_definition()
     {
        let g = grant();
        assert!(covers(&g, &call("/home/a/y", GateClass::Token, 2_000)));
        assert!(!covers(&g, &call("/home/a/y", GateClass::Token, 61_000)));
        assert!(!covers(&g, &call("/home/a/y", GateClass::Once, 2_000)));
        let mut changed = call("/home/a/y", GateClass::Token, 2_000);
        changed.definition = PlanHash::from_bytes([9; 32]);
        assert!(!covers(&g, &changed));
        let mut other = call("/home/a/y", GateClass::Token, 2_000);
        other.tenant = "conn-2";
        assert!(!covers(&g, &other));
        // A row claiming more than the cap covers nothing, MAC or not.
        let long = Grant {
            expires_at_ms: 1_000 + MAX_GRANT_MINUTES * 60_000 + 1,
            ..grant()
        };
        assert!(!covers(&long, &call("/home/a/y", GateClass::Token, 2_000)));
        // Made under `once`, a call now `token` is covered (it is minted as `token`).
        let once = Grant {
            class: GateClass::Once,
            ..grant()
        };
        assert!(covers(&once, &call("/home/a/y", GateClass::Token, 2_000)));
    }

    #[test]
    pub(crate) fn the_mac_text_changes_with_every_deciding_field() {
        let base = scope_text(&grant());
        let edits: Vec<Grant> = vec![
            Grant {
                prefix: Some("/home".into()),
                ..grant()
            },
            Grant {
                expires_at_ms: 99_000,
                ..grant()
            },
            Grant {
                tenant: Some("conn-2".into()),
                ..grant()
            },
            Grant {
                server: "fs2".into(),
                ..grant()
            },
            Grant {
                tool: "move_file".into(),
                ..grant()
            },
            Grant {
                class: GateClass::Once,
                ..grant()
            },
            Grant {
                kind: GrantKind::Call,
                ..grant()
            },
        ];
        for g in edits {
            assert_ne!(scope_text(&g), base);
        }
    }
}
