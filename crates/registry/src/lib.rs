//! The desk's registry of servers, and the guard on the files a person may edit.
//!
//! An agent's client config used to hold each server's command and credentials, so the agent
//! could reach the service around Countersign. With a registry the config holds only
//! `countersign mcp --server NAME`: the desk runs the command it has on record for the name, with
//! an environment (or, for a URL, headers) whose secret values live in the OS keychain, one item
//! per value, never in a file, never in history, never sent to a gateway.
//!
//! Who may change what (docs/design.md, "Servers and credentials"):
//! * a new name takes effect at once (it reaches no existing secret) and is recorded;
//! * changing or removing an existing server, from the command line or by editing `servers.json`
//!   behind the desk's back, is a change shown in the window ([`Engine::propose`]) that takes
//!   effect only after the person approves it; the same holds for `policy.toml` and for the
//!   rules over arguments, `policy.cedar`, whose change is said beside its diff as what it
//!   widens, proved by a solver or said not known (the `rules` room);
//! * what the person does in the desk's own settings view applies directly.
//!
//! What applies is the text the desk last accepted (kept in its SQLite file), never the file as
//! it is now: the file is the person's view of it, and an edit to it is a proposal.

mod error;
mod file;
mod guard;
pub mod rules;
mod secrets;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use countersign_core::policy::Policy;
use countersign_core::sync::lock;
use countersign_engine::{Change, ChangeDecision, ChangeKind, Engine, MAX_CHANGE_TEXT_CHARS};
use countersign_secret::{Items, SecretError};
use countersign_store::Sqlite;
use countersign_wire::{
    RegistryAnswer, RegistryCode, RegistryRequest, SecretText, ServerSpec, Setting, Upstream,
    check_name,
};
use zeroize::Zeroizing;

pub use error::RegistryError;
pub use file::{FILE_NAME, Servers};
pub use guard::{Guarded, POLICY, RULES, SERVERS, rules_in};

/// The most servers the registry holds.
pub const MAX_SERVERS: usize = 1024;

/// A registered server as the desk reaches it: its spec and every environment value or header,
/// the secret ones read from the keychain. Never printed.
pub struct Resolved {
    /// The name it is registered under.
    pub name: String,
    /// Its spec.
    pub spec: ServerSpec,
    /// Every environment variable (stdio) or header (URL), with its value.
    pub values: Vec<(String, Zeroizing<String>)>,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved")
            .field("name", &self.name)
            .field("spec", &self.spec)
            .field(
                "keys",
                &self.values.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Why a registered server cannot be reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// No server has that name.
    #[error(
        "no server named {0:?} is registered in the desk (`countersign server list` lists them; `countersign server add` registers one)"
    )]
    NoSuchServer(String),
    /// A secret value of it cannot be read.
    #[error("the secret {key} of the server {name:?} cannot be read: {detail}")]
    Secret {
        /// The server.
        name: String,
        /// The variable or header.
        key: String,
        /// Why.
        detail: String,
    },
}

/// The registry. Cheap to clone: every clone is the same registry.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

struct Inner {
    config_dir: PathBuf,
    /// The prefix of this desk's keychain accounts.
    scope: String,
    /// The engine's own records (the desk's SQLite file): the accepted text of each guarded file
    /// is kept there, through the same connection, never a second one.
    store: Arc<Sqlite>,
    /// What was accepted, by file name, as this registry last read or wrote it: the registry is
    /// the only writer of those rows, so reading them (every gateway's hello resolves its
    /// server) never waits on the engine's use of the store.
    accepted: Mutex<BTreeMap<&'static str, String>>,
    /// The keychain, or why there is none.
    items: Result<Arc<dyn Items>, SecretError>,
    engine: Engine,
    /// Held while the accepted record and its file are read or written together: a check of the
    /// file never sees the record updated and the file not yet.
    files: Mutex<()>,
    /// Held from the check of what a change applies onto (the name still free, the state the
    /// person saw) through its write: two changes never interleave, so none lands on a state it
    /// was not checked against. Taken before `files`, never while waiting for a person.
    changing: tokio::sync::Mutex<()>,
    /// Edits of guarded files being shown to the person, by file name: the text proposed.
    proposed: Mutex<BTreeMap<&'static str, String>>,
}

fn refused(code: RegistryCode, message: impl Into<String>) -> RegistryAnswer {
    RegistryAnswer::Refused {
        code,
        message: message.into(),
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("config_dir", &self.inner.config_dir)
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Opens the registry of the desk whose config directory is `config_dir`; what was accepted
    /// is kept in `records`, the engine's own (the desk's SQLite file, whose path also scopes
    /// this desk's keychain accounts). `items` is the keychain, or why there is none (servers
    /// without secrets still work). At the first start the files as found are accepted (an
    /// invalid one is reported and its default accepted instead).
    pub fn open(
        config_dir: &Path,
        records: Arc<Sqlite>,
        items: Result<Arc<dyn Items>, SecretError>,
        engine: Engine,
    ) -> Result<Registry, RegistryError> {
        let scope = {
            let mut store = records.lock();
            // Made now, as a desk's first start always made it: the scope is taken from the
            // file's canonical path, which only a file that exists has.
            store.connect()?;
            secrets::scope_of(store.path())
        };
        let registry = Registry {
            inner: Arc::new(Inner {
                config_dir: config_dir.to_owned(),
                scope,
                store: records,
                accepted: Mutex::new(BTreeMap::new()),
                items,
                engine,
                files: Mutex::new(()),
                changing: tokio::sync::Mutex::new(()),
                proposed: Mutex::new(BTreeMap::new()),
            }),
        };
        for guarded in [SERVERS, POLICY, RULES] {
            registry.first_start(guarded)?;
        }
        Ok(registry)
    }

    fn path(&self, guarded: Guarded) -> PathBuf {
        self.inner.config_dir.join(guarded.name)
    }

    fn keychain(&self) -> Result<&Arc<dyn Items>, RegistryError> {
        self.inner
            .items
            .as_ref()
            .map_err(|why| RegistryError::NoKeychain(why.to_string()))
    }

    /// The text of `guarded` that applies.
    pub fn accepted_text(&self, guarded: Guarded) -> String {
        if let Some(text) = lock(&self.inner.accepted).get(guarded.name) {
            return text.clone();
        }
        let read = self.inner.store.lock().accepted(guarded.name);
        match read {
            Ok(Some(accepted)) => {
                lock(&self.inner.accepted).insert(guarded.name, accepted.text.clone());
                accepted.text
            }
            Ok(None) => guarded.default_text(),
            Err(e) => {
                tracing::error!(target: "registry", file = guarded.name, "cannot read what was accepted: {e}");
                guarded.default_text()
            }
        }
    }

    /// The registered servers, as accepted.
    pub fn servers(&self) -> BTreeMap<String, ServerSpec> {
        Servers::parse(&self.accepted_text(SERVERS))
            .map(|s| s.servers)
            .unwrap_or_default()
    }

    /// The rules over arguments (`policy.cedar`), as accepted: `None` when there are none.
    pub fn rules_text(&self) -> Option<String> {
        rules_in(&self.accepted_text(RULES)).map(str::to_owned)
    }

    /// The policy, as accepted.
    pub fn policy(&self) -> Policy {
        Policy::from_toml(&self.accepted_text(POLICY)).unwrap_or_default()
    }

    /// The server registered as `name`, with its values, for the desk to start or reach.
    pub fn resolve(&self, name: &str) -> Result<Resolved, ResolveError> {
        let spec = self
            .servers()
            .remove(name)
            .ok_or_else(|| ResolveError::NoSuchServer(name.to_owned()))?;
        let mut values = Vec::new();
        for (key, setting) in spec.upstream.settings() {
            let value = match setting {
                Setting::Plain(v) => Zeroizing::new(v.clone()),
                Setting::Secret => {
                    let fail = |detail: String| ResolveError::Secret {
                        name: name.to_owned(),
                        key: key.clone(),
                        detail,
                    };
                    let items = self.keychain().map_err(|e| fail(e.to_string()))?;
                    items
                        .get(&secrets::account(
                            &self.inner.scope,
                            name,
                            &spec.upstream,
                            key,
                        ))
                        .map_err(|e| fail(e.to_string()))?
                        .ok_or_else(|| {
                            fail(
                                "the keychain holds no value for it (set it with `countersign \
                                 server add`)"
                                    .into(),
                            )
                        })?
                }
            };
            values.push((key.clone(), value));
        }
        Ok(Resolved {
            name: name.to_owned(),
            spec,
            values,
        })
    }

    /// Serves one request from the command line. `origin` says who asked, for the person;
    /// `waiting` is told when the person must decide first.
    pub async fn handle(
        &self,
        request: RegistryRequest,
        origin: &str,
        waiting: impl FnOnce(RegistryAnswer),
    ) -> RegistryAnswer {
        match request {
            RegistryRequest::List => RegistryAnswer::Servers {
                servers: self.servers(),
            },
            RegistryRequest::Put {
                name,
                spec,
                secrets,
            } => self.put(name, spec, secrets, origin, waiting).await,
            RegistryRequest::Remove { name } => self.remove(name, origin, waiting).await,
            RegistryRequest::KeepBackup { key, text } => self.backup_op(&key, |items, account| {
                items.set(account, text.expose()).map(|()| None)
            }),
            RegistryRequest::TakeBackup { key } => self.backup_op(&key, |items, account| {
                items
                    .get(account)
                    .map(|v| v.map(|v| SecretText::new(v.to_string())))
            }),
            RegistryRequest::DropBackup { key } => {
                self.backup_op(&key, |items, account| items.delete(account).map(|_| None))
            }
            other => refused(
                RegistryCode::BadRequest,
                format!("this desk does not know the request {other:?}"),
            ),
        }
    }

    fn backup_op(
        &self,
        key: &str,
        op: impl FnOnce(
            &Arc<dyn Items>,
            &str,
        ) -> Result<Option<SecretText>, countersign_secret::SecretError>,
    ) -> RegistryAnswer {
        // Names like `install/<client>/<hex>`: short and plain, so backups stay few and findable.
        let plain = !key.is_empty()
            && key.len() <= 128
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/-_.".contains(&b));
        if !plain {
            return refused(
                RegistryCode::BadRequest,
                "a backup key is 1 to 128 ASCII letters, digits, '/', '-', '_' or '.'",
            );
        }
        let items = match self.keychain() {
            Ok(items) => items,
            Err(e) => return refused(RegistryCode::NoKeychain, e.to_string()),
        };
        match op(items, &format!("{}/backup/{key}", self.inner.scope)) {
            Ok(text) => RegistryAnswer::Backup { text },
            Err(e) => refused(RegistryCode::NoKeychain, e.to_string()),
        }
    }

    /// What the keychain holds now for each secret key of `name`'s `upstream`.
    fn stored_secrets(
        &self,
        name: &str,
        upstream: &Upstream,
    ) -> Result<BTreeMap<String, Option<Zeroizing<String>>>, RegistryError> {
        let keys = upstream.secret_keys();
        if keys.is_empty() {
            return Ok(BTreeMap::new());
        }
        let items = self.keychain()?;
        keys.into_iter()
            .map(|key| {
                let value = items
                    .get(&secrets::account(&self.inner.scope, name, upstream, key))
                    .map_err(|e| RegistryError::NoKeychain(e.to_string()))?;
                Ok((key.to_owned(), value))
            })
            .collect()
    }

    async fn put(
        &self,
        name: String,
        spec: ServerSpec,
        secrets: BTreeMap<String, SecretText>,
        origin: &str,
        waiting: impl FnOnce(RegistryAnswer),
    ) -> RegistryAnswer {
        if let Err(e) = check_name(&name)
            .and_then(|()| spec.check())
            .and_then(|()| spec.check_secrets(&secrets))
        {
            return refused(RegistryCode::BadRequest, e.0);
        }
        if !secrets.is_empty()
            && let Err(e) = self.keychain()
        {
            return refused(RegistryCode::NoKeychain, e.to_string());
        }
        let current = {
            let _changing = self.inner.changing.lock().await;
            let mut servers = self.servers();
            match servers.remove(&name) {
                Some(current) => current,
                None => {
                    return self
                        .add_new(&name, &spec, &secrets, servers.len(), origin)
                        .await;
                }
            }
        };
        let stored = match self.stored_secrets(&name, &current.upstream) {
            Ok(stored) => stored,
            Err(e) => return refused(RegistryCode::NoKeychain, e.to_string()),
        };
        // Only a spec without secrets can be "the same" at once: answering so for given secret
        // values would tell whoever asks whether they guessed the stored ones.
        if current == spec && secrets.is_empty() {
            return RegistryAnswer::Done {
                message: format!(
                    "the server {name} is registered as given already: nothing changed"
                ),
            };
        }
        let change = Change {
            kind: ChangeKind::Server,
            subject: name.clone(),
            summary: format!("change the registered server {name}"),
            before: Some(secrets::describe(&current, &BTreeMap::new())),
            after: Some(secrets::describe(
                &spec,
                &secrets::notes(&spec, &secrets, &stored),
            )),
            origin: origin.to_owned(),
            analysis: None,
        };
        waiting(RegistryAnswer::Waiting {
            message: format!(
                "the change to {name} is shown in the Countersign desk's window: it takes effect \
                 when the person approves it"
            ),
        });
        match self.inner.engine.propose(change).await {
            ChangeDecision::Approved => {
                // Applied only onto what the person saw as "before".
                let _changing = self.inner.changing.lock().await;
                let now = self.servers().remove(&name);
                let now_stored = self.stored_secrets(&name, &current.upstream).ok();
                if now.as_ref() != Some(&current) || now_stored.as_ref() != Some(&stored) {
                    return RegistryAnswer::Denied {
                        message: format!(
                            "the server {name} changed while this change waited: nothing was \
                             applied; propose it again"
                        ),
                    };
                }
                match self.apply_put(&name, Some(&current), &spec, &secrets) {
                    Ok(()) => RegistryAnswer::Done {
                        message: format!("the person approved: the server {name} is changed"),
                    },
                    Err(answer) => answer,
                }
            }
            decision => denied(&name, decision),
        }
    }

    /// Registers a name that is not registered (the caller holds `changing` and has checked):
    /// at once, and recorded.
    async fn add_new(
        &self,
        name: &str,
        spec: &ServerSpec,
        secrets: &BTreeMap<String, SecretText>,
        registered: usize,
        origin: &str,
    ) -> RegistryAnswer {
        // New names apply without a click, so they are what a flood would be made of.
        if registered >= MAX_SERVERS {
            return refused(
                RegistryCode::BadRequest,
                format!(
                    "{MAX_SERVERS} servers are registered already, the most the desk keeps: \
                     remove ones no longer used first"
                ),
            );
        }
        if let Err(answer) = self.apply_put(name, None, spec, secrets) {
            return answer;
        }
        let note = format!(
            "registered by {origin}; took effect at once (a new name reaches no existing secret)"
        );
        self.inner
            .engine
            .record_change(ChangeKind::Server, name, Some(note))
            .await;
        RegistryAnswer::Done {
            message: format!(
                "registered the server {name}: `countersign mcp --server {name}` reaches it"
            ),
        }
    }

    async fn remove(
        &self,
        name: String,
        origin: &str,
        waiting: impl FnOnce(RegistryAnswer),
    ) -> RegistryAnswer {
        let Some(current) = self.servers().remove(&name) else {
            return refused(
                RegistryCode::NoSuchServer,
                format!("no server named {name:?} is registered"),
            );
        };
        let change = Change {
            kind: ChangeKind::Server,
            subject: name.clone(),
            summary: format!("remove the registered server {name} and its secrets"),
            before: Some(secrets::describe(&current, &BTreeMap::new())),
            after: None,
            origin: origin.to_owned(),
            analysis: None,
        };
        waiting(RegistryAnswer::Waiting {
            message: format!(
                "removing {name} is shown in the Countersign desk's window: it takes effect when \
                 the person approves it"
            ),
        });
        match self.inner.engine.propose(change).await {
            ChangeDecision::Approved => {
                let _changing = self.inner.changing.lock().await;
                if self.servers().get(&name) != Some(&current) {
                    return RegistryAnswer::Denied {
                        message: format!(
                            "the server {name} changed while this waited: nothing was removed; \
                             propose it again"
                        ),
                    };
                }
                match self.apply_remove(&name, &current) {
                    Ok(()) => RegistryAnswer::Done {
                        message: format!("the person approved: the server {name} is removed"),
                    },
                    Err(answer) => answer,
                }
            }
            decision => denied(&name, decision),
        }
    }

    /// The person's own edit in the settings view: registers or changes `name` at once.
    pub async fn put_directly(
        &self,
        name: &str,
        spec: &ServerSpec,
        secrets: &BTreeMap<String, SecretText>,
    ) -> Result<(), EditError> {
        check_name(name)
            .and_then(|()| spec.check())
            .and_then(|()| spec.check_secrets(secrets))
            .map_err(|e| EditError::new(RegistryCode::BadRequest, e.0))?;
        let _changing = self.inner.changing.lock().await;
        let current = self.servers().remove(name);
        self.apply_put(name, current.as_ref(), spec, secrets)
            .map_err(EditError::from_answer)?;
        self.inner
            .engine
            .record_change(
                ChangeKind::Server,
                name,
                Some("saved in the desk's settings view".into()),
            )
            .await;
        Ok(())
    }

    /// The person's own edit in the settings view, where a secret they left empty keeps the
    /// value the keychain holds for it: `given` has the secret values typed anew, and each other
    /// secret key of `spec` must be one `name` has on record as secret (of the same kind: an
    /// environment variable stays an environment variable). The settings view never reads a
    /// secret back, so this is how an edit of the command leaves the credentials alone.
    pub async fn put_directly_keeping(
        &self,
        name: &str,
        spec: &ServerSpec,
        given: &BTreeMap<String, SecretText>,
    ) -> Result<(), EditError> {
        let missing: Vec<&str> = spec
            .upstream
            .secret_keys()
            .into_iter()
            .filter(|key| !given.contains_key(*key))
            .collect();
        if missing.is_empty() {
            return self.put_directly(name, spec, given).await;
        }
        let bad = |code, message| Err(EditError::new(code, message));
        let current = self.servers().remove(name).filter(|current| {
            std::mem::discriminant(&current.upstream) == std::mem::discriminant(&spec.upstream)
        });
        let Some(current) = current else {
            return bad(
                RegistryCode::BadRequest,
                format!("no value was given for the secret {}", missing[0]),
            );
        };
        let stored = self
            .stored_secrets(name, &current.upstream)
            .map_err(|e| EditError::new(RegistryCode::NoKeychain, e.to_string()))?;
        let mut secrets = given.clone();
        for key in missing {
            match stored.get(key).and_then(Option::as_ref) {
                Some(value) => {
                    secrets.insert(key.to_owned(), SecretText::new(value.as_str().to_owned()));
                }
                None => {
                    return bad(
                        RegistryCode::BadRequest,
                        format!(
                            "no value was given for the secret {key}, and the keychain holds \
                             none for it"
                        ),
                    );
                }
            }
        }
        self.put_directly(name, spec, &secrets).await
    }

    /// The person's own removal in the settings view.
    pub async fn remove_directly(&self, name: &str) -> Result<(), EditError> {
        let _changing = self.inner.changing.lock().await;
        let current = self.servers().remove(name).ok_or_else(|| {
            EditError::new(
                RegistryCode::NoSuchServer,
                format!("no server named {name:?} is registered"),
            )
        })?;
        self.apply_remove(name, &current)
            .map_err(EditError::from_answer)?;
        self.inner
            .engine
            .record_change(
                ChangeKind::Server,
                name,
                Some("removed in the desk's settings view".into()),
            )
            .await;
        Ok(())
    }

    /// Stores `spec`'s secrets, then the registry with `name` as `spec`, then forgets the
    /// secrets `old` had that `spec` has not.
    fn apply_put(
        &self,
        name: &str,
        old: Option<&ServerSpec>,
        spec: &ServerSpec,
        values: &BTreeMap<String, SecretText>,
    ) -> Result<(), RegistryAnswer> {
        if !values.is_empty() {
            let items = self
                .keychain()
                .map_err(|e| refused(RegistryCode::NoKeychain, e.to_string()))?;
            for (key, value) in values {
                items
                    .set(
                        &secrets::account(&self.inner.scope, name, &spec.upstream, key),
                        value.expose(),
                    )
                    .map_err(|e| refused(RegistryCode::NoKeychain, e.to_string()))?;
            }
        }
        let mut servers = self.servers();
        servers.insert(name.to_owned(), spec.clone());
        let servers = Servers { servers };
        if !guard::showable(&servers.text()) || !guard::showable(&secrets::describe_all(&servers)) {
            return Err(refused(
                RegistryCode::BadRequest,
                format!(
                    "with this server the registry would be larger than the desk shows a person \
                     whole ({MAX_CHANGE_TEXT_CHARS} characters): make it smaller, or remove \
                     servers no longer used"
                ),
            ));
        }
        self.write(SERVERS, &servers.text())
            .map_err(|e| refused(RegistryCode::Failed, e.to_string()))?;
        if let Some(old) = old {
            self.forget_secrets(name, old, Some(spec));
        }
        Ok(())
    }

    fn apply_remove(&self, name: &str, old: &ServerSpec) -> Result<(), RegistryAnswer> {
        let mut servers = self.servers();
        servers.remove(name);
        self.write(SERVERS, &Servers { servers }.text())
            .map_err(|e| refused(RegistryCode::Failed, e.to_string()))?;
        self.forget_secrets(name, old, None);
        Ok(())
    }

    /// Deletes the keychain items of `old`'s secret keys that `new` does not keep secret.
    fn forget_secrets(&self, name: &str, old: &ServerSpec, new: Option<&ServerSpec>) {
        let Ok(items) = self.keychain() else { return };
        let kept = new.map(|n| n.upstream.secret_keys()).unwrap_or_default();
        let same_kind = new.is_some_and(|n| {
            std::mem::discriminant(&n.upstream) == std::mem::discriminant(&old.upstream)
        });
        for key in old.upstream.secret_keys() {
            if same_kind && kept.contains(key) {
                continue;
            }
            if let Err(e) = items.delete(&secrets::account(
                &self.inner.scope,
                name,
                &old.upstream,
                key,
            )) {
                tracing::warn!(target: "registry", server = name, key, "could not delete a secret no longer used: {e}");
            }
        }
    }

    /// Records `text` as accepted for `guarded` and writes its file, as one step.
    fn write(&self, guarded: Guarded, text: &str) -> Result<(), RegistryError> {
        let _files = lock(&self.inner.files);
        self.inner
            .store
            .lock()
            .accept(guarded.name, text, self.inner.engine.now_ms())?;
        lock(&self.inner.accepted).insert(guarded.name, text.to_owned());
        let path = self.path(guarded);
        guard::write_file(&path, text).map_err(|source| RegistryError::Write { path, source })
    }

    /// The person saved the policy in the desk's settings view: checked, accepted and applied.
    pub async fn save_policy_directly(&self, text: &str) -> Result<Policy, RegistryError> {
        let policy = Policy::from_toml(text).map_err(|e| RegistryError::Invalid {
            file: POLICY.name,
            reason: e.to_string(),
        })?;
        self.write(POLICY, text)?;
        self.inner.engine.set_policy(policy.clone());
        self.inner
            .engine
            .record_change(
                ChangeKind::Policy,
                POLICY.name,
                Some("saved in the desk's settings view".into()),
            )
            .await;
        Ok(policy)
    }

    /// At the first start (nothing accepted yet), accepts the file as found, or its default
    /// when it is missing or invalid.
    fn first_start(&self, guarded: Guarded) -> Result<(), RegistryError> {
        let known = self.inner.store.lock().accepted(guarded.name)?;
        if let Some(known) = known {
            lock(&self.inner.accepted).insert(guarded.name, known.text);
            return Ok(());
        }
        let text = match std::fs::read_to_string(self.path(guarded)) {
            Ok(text) => match (guarded.check)(&self.inner.engine, &text) {
                Ok(()) => text,
                Err(e) => {
                    tracing::warn!(target: "registry", file = guarded.name, "ignoring it: {e}");
                    guarded.default_text()
                }
            },
            Err(_) => guarded.default_text(),
        };
        let _files = lock(&self.inner.files);
        self.inner
            .store
            .lock()
            .accept(guarded.name, &text, self.inner.engine.now_ms())?;
        lock(&self.inner.accepted).insert(guarded.name, text);
        Ok(())
    }

    /// Compares each guarded file with what was accepted: a file edited outside the desk is
    /// proposed to the person (and applied when they approve, written back as accepted when
    /// they deny); a missing one is written again. Call it at start and every few seconds.
    pub fn check_files(&self) {
        for guarded in [SERVERS, POLICY, RULES] {
            self.check_file(guarded);
        }
    }

    fn check_file(&self, guarded: Guarded) {
        let path = self.path(guarded);
        let (found, accepted) = {
            let _files = lock(&self.inner.files);
            let accepted = self.accepted_text(guarded);
            match guard::read_file(&path) {
                Ok(Some(found)) => (found, accepted),
                Ok(None) => {
                    if let Err(e) = guard::write_file(&path, &accepted) {
                        tracing::warn!(target: "registry", file = guarded.name, "cannot write it again: {e}");
                    }
                    return;
                }
                Err(e) => {
                    tracing::warn!(target: "registry", file = guarded.name, "cannot read it: {e}");
                    return;
                }
            }
        };
        if found == accepted {
            return;
        }
        {
            let mut proposed = lock(&self.inner.proposed);
            match proposed.get(guarded.name) {
                Some(text) if *text == found => return,
                Some(_) => {
                    // Edited again while the person looks at the last edit: that one goes.
                    self.inner
                        .engine
                        .withdraw_change(guarded.kind, guarded.name);
                }
                None => {}
            }
            proposed.insert(guarded.name, found.clone());
        }
        // Whether what the person would approve is shown whole is decided on what is shown.
        let why_not = (guarded.check)(&self.inner.engine, &found)
            .err()
            .map(|e| e.to_string());
        let registry = self.clone();
        tokio::spawn(async move {
            registry
                .decide_file(guarded, accepted, found, why_not)
                .await;
        });
    }

    async fn decide_file(
        &self,
        guarded: Guarded,
        accepted: String,
        found: String,
        why_not: Option<String>,
    ) {
        // The registry is shown server by server, one fact a line, as a change from the command
        // line is: the file's layout (padding, order, a key given twice) cannot hide a change.
        let shown = |text: &str| match (guarded.kind, Servers::parse(text)) {
            (ChangeKind::Server, Ok(servers)) => secrets::describe_all(&servers),
            _ => text.to_owned(),
        };
        let (before, after) = (shown(&accepted), shown(&found));
        // What the person approves must be what they can see whole; otherwise Approve only puts
        // back what applies.
        let why_not = why_not.or_else(|| {
            (!guard::showable(&before) || !guard::showable(&after)).then(|| {
                format!("it is larger than the desk shows a person whole ({MAX_CHANGE_TEXT_CHARS} characters)")
            })
        });
        // What a change of the rules does, beside its text: proved, found, or said not known.
        let analysis = match &why_not {
            None if guarded.name == RULES.name => {
                Some(rules::what_it_changes(&self.inner.engine, &accepted, &found).await)
            }
            _ => None,
        };
        let summary = match &why_not {
            None => format!("apply {} as edited outside the desk", guarded.name),
            Some(e) => format!(
                "{} was edited outside the desk and is not valid ({e}): Approve puts back the \
                 text that applies",
                guarded.name
            ),
        };
        let change = Change {
            kind: guarded.kind,
            subject: guarded.name.to_owned(),
            summary,
            before: Some(before),
            after: Some(after),
            origin: format!("{} edited outside the desk", guarded.name),
            analysis,
        };
        let decision = self.inner.engine.propose(change).await;
        {
            let mut proposed = lock(&self.inner.proposed);
            if proposed.get(guarded.name) == Some(&found) {
                proposed.remove(guarded.name);
            }
        }
        match decision {
            ChangeDecision::Approved if why_not.is_none() => {
                let _changing = self.inner.changing.lock().await;
                if self.accepted_text(guarded) != accepted {
                    tracing::warn!(target: "registry", file = guarded.name, "an approved edit was overtaken by another change: not applied");
                    return;
                }
                if let Err(e) = self.write(guarded, &found) {
                    tracing::error!(target: "registry", file = guarded.name, "cannot accept it: {e}");
                    return;
                }
                if guarded.kind == ChangeKind::Server {
                    // Secrets of servers the edit removed, or whose keys it changed, go: a later
                    // edit naming them again must not reach the old values.
                    let old = Servers::parse(&accepted)
                        .map(|s| s.servers)
                        .unwrap_or_default();
                    let new = Servers::parse(&found)
                        .map(|s| s.servers)
                        .unwrap_or_default();
                    for (name, spec) in &old {
                        self.forget_secrets(name, spec, new.get(name));
                    }
                }
                if guarded.name == POLICY.name {
                    self.inner.engine.set_policy(self.policy());
                }
                if guarded.name == RULES.name {
                    // Checked when proposed; taken as it is now (a rule the listings since
                    // made invalid refuses what it names, never lets it through).
                    self.inner.engine.adopt_rules(self.rules_text());
                }
                tracing::info!(target: "registry", file = guarded.name, "the person approved an edit made outside the desk");
            }
            ChangeDecision::Withdrawn => {}
            _ => {
                // Denied, invalid, or overtaken: the file says again what applies.
                let _files = lock(&self.inner.files);
                if let Err(e) = guard::write_file(&self.path(guarded), &self.accepted_text(guarded))
                {
                    tracing::warn!(target: "registry", file = guarded.name, "cannot write it back: {e}");
                }
            }
        }
    }
}

fn denied(name: &str, decision: ChangeDecision) -> RegistryAnswer {
    let message = match decision {
        ChangeDecision::Denied { note: Some(note) } => {
            format!("the change to {name} was denied: {note}. Nothing changed")
        }
        ChangeDecision::Denied { note: None } => {
            format!("the change to {name} was denied. Nothing changed")
        }
        _ => format!("the change to {name} was withdrawn undecided. Nothing changed"),
    };
    RegistryAnswer::Denied { message }
}

/// Why the person's own edit in the settings view was not applied: a code to branch on (the
/// same as the command line's), and a sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct EditError {
    /// Why, as a code.
    pub code: RegistryCode,
    /// Why, for a person.
    pub message: String,
}

impl EditError {
    fn new(code: RegistryCode, message: impl Into<String>) -> Self {
        EditError {
            code,
            message: message.into(),
        }
    }

    fn from_answer(answer: RegistryAnswer) -> Self {
        match answer {
            RegistryAnswer::Refused { code, message } => EditError { code, message },
            RegistryAnswer::Denied { message } | RegistryAnswer::Done { message } => {
                EditError::new(RegistryCode::Failed, message)
            }
            other => EditError::new(RegistryCode::Failed, format!("{other:?}")),
        }
    }
}

#[cfg(test)]
mod tests;
