//! Settings' commands: the settings and policy as the view edits them, saving them, the
//! secret's rotation, and whether the desk can mint.

use countersign_core::policy::Policy;
use countersign_core::sync::lock;
use serde::{Deserialize, Serialize};

use crate::Desk;
use crate::settings::Settings;
use crate::ui_code::{UiCode, UiError};

/// Settings and policy, as the settings view edits them.
#[derive(Debug, Serialize, Deserialize)]
pub struct SettingsView {
    /// The settings.
    pub settings: Settings,
    /// The policy file's text.
    pub policy: String,
}

// The settings files and the keychain are small, local and quick: these run on the async pool
// (`async`), off the UI thread, rather than holding a blocking thread each.
/// The settings and the policy in force.
pub fn settings(desk: &Desk) -> SettingsView {
    SettingsView {
        settings: lock(&desk.settings).clone(),
        policy: desk.registry.accepted_text(countersign_registry::POLICY),
    }
}

/// Settings → Save: the settings, and the policy when its text changed (checked first).
pub async fn save_settings(desk: &Desk, view: SettingsView) -> Result<SettingsView, UiError> {
    let settings = view.settings.sanitized();
    // The person's own edit applies directly; an unchanged policy is not saved (nor recorded).
    if view.policy != desk.registry.accepted_text(countersign_registry::POLICY) {
        Policy::from_toml(&view.policy)
            .map_err(|e| UiError::new(UiCode::BadPolicy, e.to_string()))?;
        desk.registry
            .save_policy_directly(&view.policy)
            .await
            .map_err(|e| {
                let code = match e {
                    countersign_registry::RegistryError::Invalid { .. } => UiCode::BadPolicy,
                    _ => UiCode::Io,
                };
                UiError::new(code, e.to_string())
            })?;
    }
    // A collector that cannot be used is said before anything is saved.
    if let Some(endpoint) = settings
        .otlp_endpoint
        .as_deref()
        .filter(|e| !e.trim().is_empty())
    {
        countersign_otlp::Collector::new(endpoint, "countersign-desk", "desk")
            .map_err(|e| UiError::new(UiCode::BadRequest, e.to_string()))?;
    }
    let before = lock(&desk.settings).otlp_endpoint.clone();
    let settings = desk
        .dirs
        .save_settings(&settings)
        .map_err(|e| UiError::new(UiCode::Io, e.to_string()))?;
    if settings.otlp_endpoint != before {
        desk.export
            .apply(settings.otlp_endpoint.as_deref())
            .map_err(|e| UiError::new(UiCode::BadRequest, e.to_string()))?;
    }
    desk.engine
        .set_token_ttl_ms(settings.token_minutes * 60_000);
    desk.engine.set_approve_delay_ms(settings.approve_delay_ms);
    *lock(&desk.settings) = settings.clone();
    Ok(SettingsView {
        settings,
        policy: view.policy,
    })
}

/// Replaces the secret: every outstanding token stops working.
pub fn rotate_secret(desk: &Desk) -> Result<(), UiError> {
    desk.rotate_secret()
        .map_err(|e| UiError::new(UiCode::from(&e), e.to_string()))
}

/// Whether the desk can mint, and what to tell the person if not.
#[derive(Debug, Serialize)]
pub struct Status {
    /// `None` when all is well; else why nothing can be approved.
    pub secret_problem: Option<String>,
    /// The approve delay in force, in ms.
    pub approve_delay_ms: u64,
}

/// Whether the desk can mint now, and the approve delay.
pub fn status(desk: &Desk) -> Status {
    Status {
        secret_problem: desk.secret_problem(),
        approve_delay_ms: lock(&desk.settings).approve_delay_ms,
    }
}
