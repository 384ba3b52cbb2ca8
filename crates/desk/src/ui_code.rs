//! The codes the window receives with every error ([`UiCode`], [`UiError`]), and the one place each
//! cause (the engine's, the keychain's, the registry's, a team server's) is turned into one: the
//! page branches on codes, never on message text.

use serde::Serialize;

/// Every code the window may receive in a [`UiError`], and the one place they are spelled:
/// `ui/contract.json` lists them under `UiCode` (a test checks the two agree), so the window
/// branches on codes this enum has, never on message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UiCode {
    /// No request waits under this id (decided, withdrawn, or never there).
    NotPending,
    /// Policy asks for the target typed, and what was typed differs.
    TargetNotTyped,
    /// Approve came before the approve delay ended (`wait_ms` says how long is left).
    TooSoon,
    /// There is no secret (the keychain is missing or locked): nothing can be minted.
    NoSecret,
    /// The records could not be read or written.
    StoreFailed,
    /// A change to the desk cannot be widened into a grant.
    ChangeNotGrantable,
    /// The tool is destructive (or unannotated): no grant unless policy allows it.
    Destructive,
    /// Policy asks for the target typed: no grant unless policy allows it.
    TypedTarget,
    /// The tool's definition or class changed since the request was shown.
    ToolChanged,
    /// A grant's duration is zero or longer than the most allowed.
    BadDuration,
    /// A grant's path prefix is too short or has odd segments.
    BadPrefix,
    /// The target is not a path a prefix grant can cover.
    BadTarget,
    /// The target, or another path argument, is not under the prefix.
    NotUnderPrefix,
    /// As many grants as allowed are live already.
    TooManyGrants,
    /// The grant could not be stored.
    GrantNotStored,
    /// No live grant has this number.
    NoSuchGrant,
    /// The policy text does not parse.
    BadPolicy,
    /// A file or directory could not be read or written.
    Io,
    /// Anything else on the desk's side.
    Internal,
    /// What was asked is malformed or not allowed as asked.
    BadRequest,
    /// Add of a server name registered already.
    Exists,
    /// No server is registered under this name.
    NoSuchServer,
    /// The keychain holding servers' secrets is unavailable.
    NoKeychain,
    /// The asking account may not change the registry.
    AccountNotAllowed,
    /// The registry could not do it.
    Failed,
    /// The client has no configuration file to protect.
    NoConfig,
    /// The client's configuration file does not parse.
    BadConfig,
    /// The person denied the change.
    Denied,
    /// The client's file changed while the change was under way.
    ChangedMeanwhile,
    /// No original of the client's file is kept to restore.
    NoBackup,
    /// The client's file was edited since it was protected: restoring needs force.
    EditedSinceInstall,
    /// The kept original of the client's file is damaged.
    BadBackup,
}

#[cfg(test)]
impl UiCode {
    /// Every code, in the order of the contract.
    pub const ALL: [UiCode; 32] = [
        UiCode::NotPending,
        UiCode::TargetNotTyped,
        UiCode::TooSoon,
        UiCode::NoSecret,
        UiCode::StoreFailed,
        UiCode::ChangeNotGrantable,
        UiCode::Destructive,
        UiCode::TypedTarget,
        UiCode::ToolChanged,
        UiCode::BadDuration,
        UiCode::BadPrefix,
        UiCode::BadTarget,
        UiCode::NotUnderPrefix,
        UiCode::TooManyGrants,
        UiCode::GrantNotStored,
        UiCode::NoSuchGrant,
        UiCode::BadPolicy,
        UiCode::Io,
        UiCode::Internal,
        UiCode::BadRequest,
        UiCode::Exists,
        UiCode::NoSuchServer,
        UiCode::NoKeychain,
        UiCode::AccountNotAllowed,
        UiCode::Failed,
        UiCode::NoConfig,
        UiCode::BadConfig,
        UiCode::Denied,
        UiCode::ChangedMeanwhile,
        UiCode::NoBackup,
        UiCode::EditedSinceInstall,
        UiCode::BadBackup,
    ];
}

/// An error as the window receives it: a stable code to branch on, and a sentence to show.
#[derive(Debug, Clone, Serialize)]
pub struct UiError {
    /// Stable: one of [`UiCode`].
    pub code: UiCode,
    /// For the person.
    pub message: String,
    /// For `too_soon`: how long until the engine accepts an approval, in ms.
    pub wait_ms: Option<u64>,
}

impl UiError {
    /// An error with a code and a message.
    pub fn new(code: UiCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            wait_ms: None,
        }
    }
}

impl From<countersign_engine::ApproveError> for UiError {
    fn from(e: countersign_engine::ApproveError) -> Self {
        let wait_ms = match e {
            countersign_engine::ApproveError::TooSoon { wait_ms } => Some(wait_ms),
            _ => None,
        };
        UiError {
            wait_ms,
            ..UiError::new(UiCode::from(&e), e.to_string())
        }
    }
}

impl From<countersign_engine::GrantError> for UiError {
    fn from(e: countersign_engine::GrantError) -> Self {
        match e {
            countersign_engine::GrantError::Approve(e) => e.into(),
            e => UiError::new(UiCode::from(&e), e.to_string()),
        }
    }
}

impl From<countersign_registry::EditError> for UiError {
    fn from(e: countersign_registry::EditError) -> Self {
        UiError::new(UiCode::from(e.code), e.message)
    }
}

impl From<crate::approver::RemoteError> for UiError {
    fn from(e: crate::approver::RemoteError) -> Self {
        use crate::approver::RemoteError as E;
        let (code, wait_ms) = match &e {
            E::NotPending => (UiCode::NotPending, None),
            E::TargetNotTyped => (UiCode::TargetNotTyped, None),
            E::TooSoon { wait_ms } => (UiCode::TooSoon, Some(*wait_ms)),
            // The team server refused or was not reached: nothing was decided, say why.
            E::Refused { .. } | E::Unreachable(_) => (UiCode::Failed, None),
        };
        UiError {
            wait_ms,
            ..UiError::new(code, e.to_string())
        }
    }
}

impl From<&countersign_secret::SecretError> for UiCode {
    /// A keychain that is not there is said as one; a stored secret that is damaged leaves the
    /// desk with no secret; a keychain or RNG that failed otherwise is the desk's own failure.
    fn from(e: &countersign_secret::SecretError) -> Self {
        use countersign_secret::SecretError as E;
        match e {
            E::NoKeychain { .. } => UiCode::NoKeychain,
            E::WrongLength { .. } | E::Malformed { .. } => UiCode::NoSecret,
            _ => UiCode::Internal,
        }
    }
}

impl From<&countersign_engine::ApproveError> for UiCode {
    fn from(e: &countersign_engine::ApproveError) -> Self {
        use countersign_engine::ApproveError as E;
        match e {
            E::NotPending => UiCode::NotPending,
            E::TargetNotTyped => UiCode::TargetNotTyped,
            E::NoSecret(_) => UiCode::NoSecret,
            E::Store(_) => UiCode::StoreFailed,
            E::TooSoon { .. } => UiCode::TooSoon,
            _ => UiCode::Internal,
        }
    }
}

impl From<&countersign_engine::GrantError> for UiCode {
    fn from(e: &countersign_engine::GrantError) -> Self {
        use countersign_engine::GrantError as E;
        match e {
            E::Approve(e) => UiCode::from(e),
            E::Change => UiCode::ChangeNotGrantable,
            E::Destructive => UiCode::Destructive,
            E::TypedTarget => UiCode::TypedTarget,
            E::ToolChanged => UiCode::ToolChanged,
            E::Duration => UiCode::BadDuration,
            E::Prefix(_) => UiCode::BadPrefix,
            E::Target(_) => UiCode::BadTarget,
            E::NotUnder => UiCode::NotUnderPrefix,
            E::TooMany => UiCode::TooManyGrants,
            E::NotStored(_) => UiCode::GrantNotStored,
            E::NoSuchGrant => UiCode::NoSuchGrant,
            _ => UiCode::Internal,
        }
    }
}

impl From<countersign_wire::RegistryCode> for UiCode {
    fn from(code: countersign_wire::RegistryCode) -> Self {
        use countersign_wire::RegistryCode as C;
        match code {
            C::NoSuchServer => UiCode::NoSuchServer,
            C::BadRequest => UiCode::BadRequest,
            C::NoKeychain => UiCode::NoKeychain,
            C::AccountNotAllowed => UiCode::AccountNotAllowed,
            C::Failed => UiCode::Failed,
            _ => UiCode::Internal,
        }
    }
}
