//! Grants in the window: what may be offered beside Approve for a request, Approve with a
//! widening, the list of live grants, and Revoke.
//!
//! `approve_widening` approves (it passes through `Engine::approve`'s checks) and is reachable,
//! like `approve`, only from the approval window (`capabilities/approval.json`). Every string a
//! grant holds came from an agent or an upstream (server, tool, target, prefix, summary) and
//! reaches the screen through [`shown`]. Errors cross as [`UiError`] codes.

use countersign_core::Tenant;
use countersign_engine::{GrantOffer, Widening};
use countersign_store::{Grant, GrantKind};
use serde::Serialize;

use crate::Desk;
use crate::commands::off_the_ui;
use crate::commands::queue::check_keychain;
use crate::ui_code::{UiCode, UiError};
use crate::view::{Shown, agent_name, shown};
use crate::window::Windowed;

/// What the window may offer beside Approve for one request: the engine's [`GrantOffer`] (its
/// fields inline), with the proposed prefix as shown.
#[derive(Debug, Clone, Serialize)]
pub struct OfferView {
    /// The offer. Its `default_prefix`, to fill the field with, holds no control, invisible or
    /// direction-changing character (such a path is never a prefix).
    #[serde(flatten)]
    pub offer: GrantOffer,
    /// The proposed prefix as shown (flagged when it holds non-ASCII characters).
    pub default_prefix_shown: Option<Shown>,
}

impl From<GrantOffer> for OfferView {
    fn from(offer: GrantOffer) -> Self {
        OfferView {
            default_prefix_shown: offer.default_prefix.as_deref().map(shown),
            offer,
        }
    }
}

/// A live grant, as the Grants view lists it.
#[derive(Debug, Clone, Serialize)]
pub struct GrantRow {
    /// Its number.
    pub id: u64,
    /// `call` (this same call) or `prefix` (targets under a prefix, for one connection).
    pub kind: &'static str,
    /// The server.
    pub server: Shown,
    /// The tool.
    pub tool: Shown,
    /// For a prefix grant, the prefix; for a call grant, the call's target.
    pub scope: Shown,
    /// The summary of the call whose click made it.
    pub summary: Shown,
    /// For a call grant, the plan hash it covers.
    pub plan_hash: Option<String>,
    /// Whether the tokens it mints work once.
    pub works_once: bool,
    /// When it was made, ms since the epoch.
    pub granted_at_ms: u64,
    /// When it stops, ms since the epoch.
    pub expires_at_ms: u64,
    /// How many calls it approved.
    pub uses: u64,
    /// For a session grant: the agent of its connection, as it names itself.
    pub agent: Option<Shown>,
}

impl GrantRow {
    /// The row for `g`; `client_info`: its connection's agent, for a session grant.
    fn new(g: &Grant, client_info: Option<&serde_json::Value>) -> Self {
        GrantRow {
            id: g.id,
            kind: g.kind.code(),
            server: shown(&g.server),
            tool: shown(&g.tool),
            scope: shown(match g.kind {
                GrantKind::Prefix => g.prefix.as_deref().unwrap_or_default(),
                GrantKind::Call => &g.target,
            }),
            summary: shown(&g.summary),
            plan_hash: g.plan.map(|p| p.to_hex()),
            works_once: g.class.is_single_use(),
            granted_at_ms: g.granted_at_ms,
            expires_at_ms: g.expires_at_ms,
            uses: g.uses,
            agent: client_info.map(|c| shown(&agent_name(c))),
        }
    }
}

/// The live grants as rows.
async fn rows(engine: &countersign_engine::Engine) -> Result<Vec<GrantRow>, UiError> {
    let grants = engine
        .grants()
        .await
        .map_err(|e| UiError::new(UiCode::StoreFailed, e.to_string()))?;
    Ok(grants
        .iter()
        .map(|g| {
            let agent = g
                .tenant
                .as_deref()
                .and_then(|t| engine.client_info_of(&Tenant::recorded(t)));
            GrantRow::new(g, agent.as_ref())
        })
        .collect())
}

/// What may be offered beside Approve for request `id` (`None`: it no longer waits).
pub async fn grant_offer(desk: &Desk, id: u64) -> Result<Option<OfferView>, UiError> {
    let engine = desk.engine.clone();
    off_the_ui(move || Ok(engine.grant_offer(id).map(OfferView::from))).await
}

/// A person clicked Approve with a widening chosen (after the delay, with the target typed where
/// policy asks): the request is approved and the grant made; answers its number.
pub async fn approve_widening(
    window: &Windowed,
    desk: &Desk,
    id: u64,
    typed_target: Option<String>,
    widening: Widening,
) -> Result<u64, UiError> {
    // Mint only while the keychain answers, as `approve` does.
    if let Some(why) = check_keychain(desk, window).await {
        return Err(UiError::new(
            UiCode::NoSecret,
            format!("Nothing can be approved: {why}."),
        ));
    }
    Ok(desk
        .engine
        .approve_widening(id, typed_target.as_deref(), &widening)
        .await?)
}

/// The live grants, oldest first.
pub async fn grants(desk: &Desk) -> Result<Vec<GrantRow>, UiError> {
    rows(&desk.engine).await
}

/// A person clicked Revoke on grant `id`; answers the live grants left.
pub async fn revoke_grant(desk: &Desk, id: u64) -> Result<Vec<GrantRow>, UiError> {
    desk.engine.revoke_grant(id).await?;
    rows(&desk.engine).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::contract;
    use countersign_core::{GateClass, PlanHash};

    #[test]
    fn the_grant_views_carry_exactly_the_fields_of_the_contract() {
        let grant = Grant {
            id: 3,
            kind: GrantKind::Prefix,
            server: "fs".into(),
            tool: "write_file".into(),
            tenant: Some("conn-1".into()),
            plan: None,
            prefix: Some("/home/\u{430}".into()),
            target: "/home/\u{430}/x".into(),
            summary: "write_file on /home/a/x".into(),
            class: GateClass::Token,
            definition: PlanHash::from_bytes([1; 32]),
            request: 1,
            granted_at_ms: 1,
            expires_at_ms: 2,
            uses: 0,
            ended: None,
            mac: [0; 32],
        };
        let agent = serde_json::json!({"name": "claude-code", "version": "1.0"});
        let row = serde_json::to_value(GrantRow::new(&grant, Some(&agent))).unwrap();
        assert_eq!(row["agent"]["text"], "claude-code 1.0");
        assert_eq!(contract::keys(&row), contract::expected("GrantRow"));
        // The look-alike prefix is flagged.
        assert_eq!(row["scope"]["flags"], serde_json::json!(["non_ascii"]));
        let offer = GrantOffer {
            call: true,
            call_code: None,
            call_why: None,
            prefix: false,
            prefix_code: Some("bad_target"),
            prefix_why: Some("…".into()),
            default_prefix: None,
            max_minutes: 480,
        };
        let offer = serde_json::to_value(OfferView::from(offer)).unwrap();
        assert_eq!(contract::keys(&offer), contract::expected("OfferView"));
    }
}
