//! What `countersign install` and `countersign uninstall` do, in the order that loses nothing:
//! the original file goes into the keychain first (it holds the credentials, so never into a
//! file under the home), then every server is registered, and only when all of them are does
//! the file change, atomically, keeping its mode. Uninstall puts back the entries install
//! rewrote, each byte for byte as it was, and keeps every other byte of the file as it is now:
//! clients write their own files all the time (Claude Code on every start), and those writes
//! are not install's to undo. It refuses, naming them, when one of those entries was changed
//! since install wrote it, unless forced ([`crate::undo`] says how).
//!
//! The backup kept under [`backup_key`] is one small JSON document: the client, the file, and a
//! step per install that changed the file (its original, the SHA-256 of what install wrote, the
//! servers it registered, and `rewritten`: the file as install wrote it and the place of each
//! entry it rewrote). From the original and the written file uninstall finds each entry's text
//! before and after install, so neither is kept twice. A second install after the person added a
//! server pushes a step rather than overwriting the first original, which holds the first
//! servers' credentials. A step written before `rewritten` existed is restored as then: the
//! whole original when the file is as install wrote it, a refusal otherwise (`--force`: the
//! whole original anyway).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use countersign_wire::{
    DeskError, RegistryAnswer, RegistryCode, RegistryRequest, SecretText, ServerSpec, Upstream,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Client, EntryAt, Found, Leave, name_from_key, read_entries, rewrite};
use crate::Registrar;
use crate::error::{BackupError, EditError, ParseError, PutBackError};
use crate::undo::{self, Text, Undo};

/// What to install into (or restore), and how.
#[derive(Debug, Clone)]
pub struct Options {
    /// The client whose file it is.
    pub client: Client,
    /// The client's configuration file.
    pub path: PathBuf,
    /// The `countersign` program the rewritten entries start.
    pub program: String,
    /// Install: say what would change and change nothing.
    pub dry_run: bool,
    /// Uninstall: put the entries install rewrote back even when one was changed since.
    pub force: bool,
}

/// Why install or uninstall stopped. Nothing here ever holds a secret value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstallError {
    /// The file has no configuration to protect.
    #[error("{client} keeps its configuration in {path}, and there is none there")]
    NoConfig {
        /// The client's name.
        client: &'static str,
        /// The file looked for.
        path: PathBuf,
    },
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file is not what the client reads.
    #[error("{path} is not a configuration Countersign can read: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and what (never the text itself).
        #[source]
        source: EditError,
    },
    /// The file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The desk could not be reached, or the connection broke.
    #[error("{0}")]
    Desk(#[from] DeskError),
    /// The desk refused a request.
    #[error("the desk refused {what}: {message} [{}]; {consequence}", code.code())]
    Refused {
        /// What was asked.
        what: String,
        /// The refusal's code.
        code: RegistryCode,
        /// Its sentence.
        message: String,
        /// What that means for the file.
        consequence: String,
    },
    /// The person denied registering a server.
    #[error("registering {name} was denied: {message}; {consequence}")]
    Denied {
        /// The server.
        name: String,
        /// The person's note, or why.
        message: String,
        /// What that means for the file.
        consequence: String,
    },
    /// The desk answered something that does not fit the request.
    #[error("the desk answered {what} with something else; {consequence}")]
    Unexpected {
        /// What was asked.
        what: String,
        /// What that means for the file.
        consequence: String,
    },
    /// The file changed while install was registering its servers.
    #[error(
        "{path} changed while its servers were being registered (the client may have written \
         it); it was left as it was: run install again"
    )]
    ChangedMeanwhile {
        /// The file.
        path: PathBuf,
    },
    /// Uninstall found no backup of the file.
    #[error("no backup of {path} from `countersign install --client {client}`: nothing to restore")]
    NoBackup {
        /// The client's name.
        client: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// Entries install rewrote were changed after install wrote them (or, for an install made
    /// before the entries were recorded, the file was).
    #[error("{}", edited_since(.client, .path, .entries))]
    EditedSinceInstall {
        /// The client's name.
        client: &'static str,
        /// The file.
        path: PathBuf,
        /// The changed entries, by place (`mcpServers.github`); empty for an install made
        /// before they were recorded, which only the whole file can undo.
        entries: Vec<String>,
    },
    /// An entry install rewrote cannot be put back alone, and why; nothing was written.
    #[error(
        "{path}: the entry {entry} cannot be put back: {why}; the file was left as it was. \
         The original is in the keychain; `countersign server list` shows the server it became"
    )]
    CannotPutBack {
        /// The file.
        path: PathBuf,
        /// The entry, by place.
        entry: String,
        /// Why (never a value of the file).
        #[source]
        why: PutBackError,
    },
    /// The file kept changing while uninstall was putting the entries back.
    #[error(
        "{path} kept changing while its entries were being put back (the client may be \
         writing it); it was left as it was: run uninstall again"
    )]
    ChangedWhileRestoring {
        /// The file.
        path: PathBuf,
    },
    /// The backup in the keychain is not one install wrote.
    #[error("the backup of {path} in the keychain cannot be read: {source}")]
    BadBackup {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: BackupError,
    },
}

fn edited_since(client: &str, path: &Path, entries: &[String]) -> String {
    if entries.is_empty() {
        return format!(
            "{} was changed since `countersign install` wrote it, and that install (by an \
             earlier countersign) kept only the whole file, so restoring it would lose those \
             changes. `countersign uninstall --client {client} --force` restores it anyway",
            path.display()
        );
    }
    let (them, were) = match entries.len() {
        1 => ("it", "was"),
        _ => ("them", "were"),
    };
    format!(
        "{}: {} {were} changed since `countersign install` rewrote {them}; putting back the \
         original would lose those changes. `countersign uninstall --client {client} --force` \
         puts {them} back anyway (the rest of the file stays as it is)",
        path.display(),
        entries.join(", "),
    )
}

/// A server install registers.
#[derive(Debug)]
pub struct Registration {
    /// Its entry in the client's file.
    pub at: EntryAt,
    /// Its name in the desk.
    pub name: String,
    /// What the desk will run or reach.
    pub spec: ServerSpec,
    /// The values of its secret environment variables or headers.
    pub secrets: BTreeMap<String, SecretText>,
}

/// What install would do to one file.
#[derive(Debug)]
pub struct Installation {
    /// The servers to register, in the file's order.
    pub registrations: Vec<Registration>,
    /// Entries that already start `countersign mcp`.
    pub wrapped: Vec<EntryAt>,
    /// Entries left as they are, why, and what the person can do.
    pub left: Vec<(EntryAt, Leave)>,
    /// The file as install writes it (the same text when there is nothing to register).
    pub text: String,
}

/// Plans the installation of `text`, a configuration file of `client`: a name in the desk for
/// each server (the entry's key, made a valid name; suffixed `-2`, `-3`, ... when that name is
/// registered for something else) and the rewritten file. `registered` is what the desk holds.
pub fn plan(
    client: Client,
    text: &str,
    registered: &BTreeMap<String, ServerSpec>,
    program: &str,
) -> Result<Installation, EditError> {
    let mut registrations: Vec<Registration> = Vec::new();
    let mut wrapped = Vec::new();
    let mut left = Vec::new();
    for (at, found) in read_entries(client, text)? {
        let server = match found {
            Found::Wrapped => {
                wrapped.push(at);
                continue;
            }
            Found::Left(why) => {
                left.push((at, why));
                continue;
            }
            Found::Server(server) => server,
        };
        let base = name_from_key(&at.key);
        let name = (1..)
            .map(|n| match n {
                1 => base.clone(),
                n => format!("{base}-{n}"),
            })
            .find(|name| {
                let free_in_desk = registered.get(name).is_none_or(|spec| *spec == server.spec);
                // Two entries of one file share a name only when they are the same server.
                let free_here = registrations.iter().all(|r| {
                    r.name != *name || (r.spec == server.spec && r.secrets == server.secrets)
                });
                free_in_desk && free_here
            })
            .expect("some suffix is free");
        registrations.push(Registration {
            at,
            name,
            spec: server.spec,
            secrets: server.secrets,
        });
    }
    let names: Vec<(EntryAt, String)> = registrations
        .iter()
        .map(|r| (r.at.clone(), r.name.clone()))
        .collect();
    let text = if names.is_empty() {
        text.to_owned()
    } else {
        rewrite(client, text, &names, program)?
    };
    // What was written must read back as the gateway, entry by entry, in every format.
    if !names.is_empty() {
        let wrapped: Vec<EntryAt> = read_entries(client, &text)?
            .into_iter()
            .filter(|(_, found)| matches!(found, Found::Wrapped))
            .map(|(at, _)| at)
            .collect();
        if let Some((at, _)) = names.iter().find(|(at, _)| !wrapped.contains(at)) {
            return Err(EditError::NotWrapped { at: at.clone() });
        }
    }
    Ok(Installation {
        registrations,
        wrapped,
        left,
        text,
    })
}

/// The keychain key of the backup of `path` (made absolute and free of symlinks first) for
/// `client`: the same for install and uninstall however the path was typed.
pub fn backup_key(client: Client, canonical_path: &Path) -> String {
    let digest = Sha256::digest(canonical_path.as_os_str().as_encoded_bytes());
    format!("install/{}/{}", client.id(), hex(&digest[..16]))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The backup of one file: what each install that changed it found there. Holds credentials:
/// it lives in the keychain only, and has no `Debug`.
#[derive(Serialize, Deserialize)]
struct Backup {
    format: u32,
    client: String,
    path: String,
    steps: Vec<Step>,
}

#[derive(Clone, Serialize, Deserialize)]
struct Step {
    /// The file before this install.
    original: String,
    /// The SHA-256 of the file as this install wrote it.
    installed_sha256: String,
    /// The servers this install registered.
    servers: Vec<String>,
    /// What uninstall needs to put back only the rewritten entries; absent in a step written by
    /// an earlier countersign, or when the entries cannot be put back alone (then the whole
    /// file is restored, as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rewritten: Option<Rewritten>,
}

#[derive(Clone, Serialize, Deserialize)]
struct Rewritten {
    /// The file as this install wrote it.
    installed: String,
    /// Each entry it rewrote.
    entries: Vec<EntryAt>,
}

/// The record of `plan`'s entries, when putting them back alone into the very file install
/// writes gives back `original` byte for byte (else uninstall goes by the whole file).
fn rewritten(client: Client, original: &str, plan: &Installation) -> Option<Rewritten> {
    let entries: Vec<EntryAt> = plan.registrations.iter().map(|r| r.at.clone()).collect();
    let back = undo::undo(client, original, &plan.text, &plan.text, &entries, false).ok()?;
    (back == original).then(|| Rewritten {
        installed: plan.text.clone(),
        entries,
    })
}

const BACKUP_FORMAT: u32 = 1;

impl Backup {
    fn to_secret(&self) -> SecretText {
        SecretText::new(serde_json::to_string(self).expect("a backup serializes"))
    }

    fn from_secret(text: &SecretText, path: &Path) -> Result<Backup, InstallError> {
        let bad = |source| InstallError::BadBackup {
            path: path.to_owned(),
            source,
        };
        // serde_json's message names a place, never the text.
        let backup: Backup =
            serde_json::from_str(text.expose()).map_err(|e| bad(BackupError::Json(e)))?;
        if backup.format != BACKUP_FORMAT {
            return Err(bad(BackupError::Format {
                found: backup.format,
                reads: BACKUP_FORMAT,
            }));
        }
        Ok(backup)
    }
}

/// A path made absolute and free of symlinks (a file that does not exist: its directory), so
/// that a config kept as a symlink into a dotfiles repository is edited where it lives.
fn canonical(path: &Path) -> io::Result<PathBuf> {
    match fs::canonicalize(path) {
        Ok(p) => Ok(p),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let name = path
                .file_name()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            Ok(fs::canonicalize(dir)?.join(name))
        }
        Err(e) => Err(e),
    }
}

/// Writes `bytes` to `path` as one step: a temporary file in the same directory, flushed to
/// disk, renamed over the old one, the directory flushed; with `mode`.
fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir.join(format!(".{name}.countersign-{}.tmp", std::process::id()));
    let written = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(bytes)?;
        // The umask had its say at creation; the original's mode is what the client expects.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written?;
    fs::File::open(dir)?.sync_all()
}

/// One request to the desk, its `Waiting` message (the person must decide) written to `out`.
fn ask(
    registrar: &mut dyn Registrar,
    request: RegistryRequest,
    out: &mut dyn Write,
) -> Result<RegistryAnswer, DeskError> {
    registrar.ask(request, &mut |message| {
        let _ = writeln!(out, "  waiting: {message}");
    })
}

fn take_backup(
    registrar: &mut dyn Registrar,
    key: &str,
    path: &Path,
    out: &mut dyn Write,
    consequence: &str,
) -> Result<Option<Backup>, InstallError> {
    let what = || format!("to give the backup of {}", path.display());
    match ask(
        registrar,
        RegistryRequest::TakeBackup { key: key.into() },
        out,
    )? {
        RegistryAnswer::Backup { text: None } => Ok(None),
        RegistryAnswer::Backup { text: Some(text) } => Backup::from_secret(&text, path).map(Some),
        RegistryAnswer::Refused { code, message } => Err(InstallError::Refused {
            what: what(),
            code,
            message,
            consequence: consequence.into(),
        }),
        _ => Err(InstallError::Unexpected {
            what: what(),
            consequence: consequence.into(),
        }),
    }
}

/// Keeps `backup` under `key` (none: forgets what is kept).
fn put_backup(
    registrar: &mut dyn Registrar,
    key: &str,
    backup: Option<&Backup>,
    path: &Path,
    out: &mut dyn Write,
    consequence: &str,
) -> Result<(), InstallError> {
    let what = format!("to keep the backup of {}", path.display());
    let request = match backup {
        Some(backup) => RegistryRequest::KeepBackup {
            key: key.into(),
            text: backup.to_secret(),
        },
        None => RegistryRequest::DropBackup { key: key.into() },
    };
    match ask(registrar, request, out)? {
        // The desk answers a kept or dropped backup with an empty `Backup`.
        RegistryAnswer::Done { .. } | RegistryAnswer::Backup { text: None } => Ok(()),
        RegistryAnswer::Refused { code, message } => Err(InstallError::Refused {
            what,
            code,
            message,
            consequence: consequence.into(),
        }),
        _ => Err(InstallError::Unexpected {
            what,
            consequence: consequence.into(),
        }),
    }
}

/// How a spec reads on the terminal: the program or the URL's place (a URL's query may carry a
/// key, and arguments are not shown either), and which settings went into the keychain.
fn describe(spec: &ServerSpec) -> String {
    let (reach, word) = match &spec.upstream {
        Upstream::Stdio { command, .. } => (
            format!("runs {}", command.first().map_or("", String::as_str)),
            "environment variable",
        ),
        Upstream::Http { url, .. } => {
            let place = url.split(['?', '#']).next().unwrap_or(url);
            (format!("reaches {place}"), "header")
        }
    };
    let secret: Vec<&str> = spec.upstream.secret_keys().into_iter().collect();
    match secret.len() {
        0 => reach,
        1 => format!("{reach}; {word} {} in the keychain", secret[0]),
        _ => format!("{reach}; {word}s {} in the keychain", secret.join(", ")),
    }
}

fn read_config(client: Client, path: &Path) -> Result<(String, u32), InstallError> {
    let read = |source| InstallError::Read {
        path: path.to_owned(),
        source,
    };
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(InstallError::NoConfig {
                client: client.title(),
                path: path.to_owned(),
            });
        }
        Err(e) => return Err(read(e)),
    };
    let mode = fs::metadata(path).map_err(read)?.permissions().mode() & 0o7777;
    let text = String::from_utf8(bytes).map_err(|e| InstallError::Parse {
        path: path.to_owned(),
        source: ParseError::NotUtf8(e.utf8_error()).into(),
    })?;
    Ok((text, mode))
}

/// Protects the client's configuration at `options.path`: registers each of its servers in
/// the desk that `registrar` reaches, keeps the original in the keychain, and rewrites each
/// entry to `countersign mcp --server NAME`; says what it did (or, with `dry_run`, would do) on
/// `out`. This is what `countersign install` runs, and what an end-to-end test runs against a
/// real desk over its socket (the command line's `DeskAt`).
pub fn install(
    registrar: &mut dyn Registrar,
    options: &Options,
    out: &mut dyn Write,
) -> Result<(), InstallError> {
    let client = options.client;
    let shown = &options.path;
    let (text, mode) = read_config(client, shown)?;
    let path = canonical(shown).map_err(|source| InstallError::Read {
        path: shown.clone(),
        source,
    })?;
    let untouched = format!("{} was left as it was", shown.display());
    let registered = match ask(registrar, RegistryRequest::List, out)? {
        RegistryAnswer::Servers { servers } => servers,
        RegistryAnswer::Refused { code, message } => {
            return Err(InstallError::Refused {
                what: "to list its servers".into(),
                code,
                message,
                consequence: untouched,
            });
        }
        _ => {
            return Err(InstallError::Unexpected {
                what: "a list of its servers".into(),
                consequence: untouched,
            });
        }
    };
    let plan = plan(client, &text, &registered, &options.program).map_err(|source| {
        InstallError::Parse {
            path: shown.clone(),
            source,
        }
    })?;
    let _ = writeln!(out, "{}: {}", client.title(), shown.display());
    for at in &plan.wrapped {
        let _ = writeln!(out, "  already through Countersign: {at}");
    }
    for (at, left) in &plan.left {
        let _ = writeln!(out, "  NOT protected, left as it was: {at}: {}", left.why);
    }
    if plan.registrations.is_empty() {
        let _ = writeln!(out, "  nothing to do");
        return Ok(());
    }
    if options.dry_run {
        for r in &plan.registrations {
            let _ = writeln!(
                out,
                "  would register {} in the desk ({}) and rewrite {} to `countersign mcp --server {}`",
                r.name,
                describe(&r.spec),
                r.at,
                r.name
            );
        }
        let _ = writeln!(out, "  nothing was changed (--dry-run)");
        return Ok(());
    }

    // 1. The original, into the keychain.
    let key = backup_key(client, &path);
    let previous = take_backup(registrar, &key, &path, out, &untouched)?;
    let step = Step {
        original: text.clone(),
        installed_sha256: sha256(plan.text.as_bytes()),
        servers: plan.registrations.iter().map(|r| r.name.clone()).collect(),
        rewritten: rewritten(client, &text, &plan),
    };
    let mut backup = match &previous {
        Some(previous) => Backup {
            format: BACKUP_FORMAT,
            client: previous.client.clone(),
            path: previous.path.clone(),
            steps: previous.steps.clone(),
        },
        None => Backup {
            format: BACKUP_FORMAT,
            client: client.id().into(),
            path: path.display().to_string(),
            steps: Vec::new(),
        },
    };
    // An install that stopped before writing left its step on top: this one takes its place.
    if backup.steps.last().is_some_and(|s| s.original == text) {
        backup.steps.pop();
    }
    backup.steps.push(step);
    put_backup(registrar, &key, Some(&backup), &path, out, &untouched)?;
    let _ = writeln!(
        out,
        "  kept the original in the keychain (`countersign uninstall --client {client}` restores it)"
    );

    // 2. Every server, or the file stays as it was (and so does the backup).
    let mut done: Vec<&str> = Vec::new();
    let registered_so_far = |done: &[&str]| {
        if done.is_empty() {
            untouched.clone()
        } else {
            format!(
                "{untouched} (registered before that, and still in the desk: {})",
                done.join(", ")
            )
        }
    };
    for r in &plan.registrations {
        let request = RegistryRequest::Put {
            name: r.name.clone(),
            spec: r.spec.clone(),
            secrets: r.secrets.clone(),
        };
        let failure = match ask(registrar, request, out) {
            Ok(RegistryAnswer::Done { .. }) => {
                let _ = writeln!(
                    out,
                    "  registered {} in the desk ({})",
                    r.name,
                    describe(&r.spec)
                );
                done.push(&r.name);
                continue;
            }
            Ok(RegistryAnswer::Denied { message }) => InstallError::Denied {
                name: r.name.clone(),
                message,
                consequence: registered_so_far(&done),
            },
            Ok(RegistryAnswer::Refused { code, message }) => InstallError::Refused {
                what: format!("to register {}", r.name),
                code,
                message,
                consequence: registered_so_far(&done),
            },
            Ok(_) => InstallError::Unexpected {
                what: format!("registering {}", r.name),
                consequence: registered_so_far(&done),
            },
            Err(e) => InstallError::Desk(e),
        };
        restore_backup(registrar, &key, previous.as_ref(), &path, out);
        return Err(failure);
    }

    // 3. The file, unless someone wrote it meanwhile (Claude Code rewrites ~/.claude.json often).
    let now = fs::read(shown).map_err(|source| InstallError::Read {
        path: shown.clone(),
        source,
    })?;
    if now != text.as_bytes() {
        restore_backup(registrar, &key, previous.as_ref(), &path, out);
        return Err(InstallError::ChangedMeanwhile {
            path: shown.clone(),
        });
    }
    write_atomically(&path, plan.text.as_bytes(), mode).map_err(|source| InstallError::Write {
        path: shown.clone(),
        source,
    })?;
    for r in &plan.registrations {
        let _ = writeln!(
            out,
            "  rewrote {} to `countersign mcp --server {}`",
            r.at, r.name
        );
    }
    Ok(())
}

/// Puts the backup back as it was before a failed install; a failure here is said, not raised
/// (the install's own failure is the news).
fn restore_backup(
    registrar: &mut dyn Registrar,
    key: &str,
    previous: Option<&Backup>,
    path: &Path,
    out: &mut dyn Write,
) {
    if let Err(e) = put_backup(registrar, key, previous, path, out, "") {
        let _ = writeln!(
            out,
            "  (the backup kept in the keychain for this try could not be taken back: {e})"
        );
    }
}

/// What uninstall writes, and how it came to be.
enum Restored {
    /// The whole original: the file was as install wrote it (or an earlier install's step, or
    /// forced).
    Whole(String),
    /// Today's file with the rewritten entries put back; those forced back although changed.
    Entries(String, Vec<EntryAt>),
}

/// What to write for `step` over the file as it is now (`None`: there is none).
fn restored(
    client: Client,
    step: &Step,
    current: Option<&[u8]>,
    options: &Options,
) -> Result<Restored, InstallError> {
    let shown = &options.path;
    let whole = || Restored::Whole(step.original.clone());
    let edited = |entries: Vec<String>| InstallError::EditedSinceInstall {
        client: client.id(),
        path: shown.clone(),
        entries,
    };
    let Some(current) = current else {
        // No file: nothing of the client's to keep.
        return match &step.rewritten {
            _ if options.force => Ok(whole()),
            Some(r) => Err(edited(r.entries.iter().map(ToString::to_string).collect())),
            None => Err(edited(Vec::new())),
        };
    };
    if sha256(current) == step.installed_sha256 {
        return Ok(whole());
    }
    let Some(record) = &step.rewritten else {
        return if options.force {
            Ok(whole())
        } else {
            Err(edited(Vec::new()))
        };
    };
    let text = std::str::from_utf8(current).map_err(|e| InstallError::Parse {
        path: shown.clone(),
        source: ParseError::NotUtf8(e).into(),
    })?;
    let unparsed = |source: EditError| InstallError::Parse {
        path: shown.clone(),
        source,
    };
    let bad_backup = |source| InstallError::BadBackup {
        path: shown.clone(),
        source,
    };
    let unreadable = |which: Text, e: ParseError| match which {
        Text::Current => unparsed(e.into()),
        Text::Original => bad_backup(BackupError::Original(e)),
        Text::Installed => bad_backup(BackupError::Installed(e)),
    };
    let forced = if options.force {
        undo::changed(client, &record.installed, text, &record.entries)
            .map_err(|(which, e)| unreadable(which, e))?
    } else {
        Vec::new()
    };
    match undo::undo(
        client,
        &step.original,
        &record.installed,
        text,
        &record.entries,
        options.force,
    ) {
        Ok(out) => Ok(Restored::Entries(out, forced)),
        Err(Undo::Changed(entries)) => {
            Err(edited(entries.iter().map(ToString::to_string).collect()))
        }
        Err(Undo::Unplaced(at, why)) => Err(InstallError::CannotPutBack {
            path: shown.clone(),
            entry: at.to_string(),
            why,
        }),
        Err(Undo::Unreadable(which, e)) => Err(unreadable(which, e)),
        Err(Undo::Overlap) => Err(unparsed(EditError::Overlap)),
    }
}

/// How many times uninstall reads the file again when the client wrote it meanwhile.
const TRIES: usize = 5;

/// Restores what the last install of the client's configuration at `options.path` rewrote: each
/// entry as it was, byte for byte, and every other byte as the file is now. Refuses, naming
/// them, when one of those entries was changed since, unless `options.force`; the servers stay
/// registered. Says what it did on `out`.
pub fn uninstall(
    registrar: &mut dyn Registrar,
    options: &Options,
    out: &mut dyn Write,
) -> Result<(), InstallError> {
    let client = options.client;
    let shown = &options.path;
    let path = canonical(shown).map_err(|source| InstallError::Read {
        path: shown.clone(),
        source,
    })?;
    let key = backup_key(client, &path);
    let untouched = format!("{} was left as it was", shown.display());
    let Some(mut backup) = take_backup(registrar, &key, &path, out, &untouched)? else {
        return Err(InstallError::NoBackup {
            client: client.id(),
            path: shown.clone(),
        });
    };
    let Some(step) = backup.steps.pop() else {
        return Err(InstallError::NoBackup {
            client: client.id(),
            path: shown.clone(),
        });
    };
    let read_now = || match fs::read(&path) {
        Ok(bytes) => {
            let mode = fs::metadata(&path)
                .map(|m| m.permissions().mode() & 0o7777)
                .unwrap_or(0o600);
            Ok((Some(bytes), mode))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok((None, 0o600)),
        Err(source) => Err(InstallError::Read {
            path: shown.clone(),
            source,
        }),
    };
    // The client may write the file between the read and the write: read it again just
    // before, and start over when it did, so that its write is kept too.
    let mut written = None;
    for _ in 0..TRIES {
        let (current, mode) = read_now()?;
        let result = restored(client, &step, current.as_deref(), options)?;
        if read_now()?.0 != current {
            continue;
        }
        let bytes = match &result {
            Restored::Whole(text) | Restored::Entries(text, _) => text.as_bytes(),
        };
        write_atomically(&path, bytes, mode).map_err(|source| InstallError::Write {
            path: shown.clone(),
            source,
        })?;
        written = Some(result);
        break;
    }
    let Some(result) = written else {
        return Err(InstallError::ChangedWhileRestoring {
            path: shown.clone(),
        });
    };
    let _ = writeln!(out, "{}: {}", client.title(), shown.display());
    let now = match &result {
        Restored::Whole(text) => {
            let _ = writeln!(
                out,
                "  restored the file as it was before `countersign install`"
            );
            text
        }
        Restored::Entries(text, forced) => {
            let entries = step.rewritten.as_ref().map_or(&[][..], |r| &r.entries[..]);
            let names: Vec<String> = entries.iter().map(ToString::to_string).collect();
            let _ = writeln!(
                out,
                "  put back the entries `countersign install` rewrote, as they were: {}; the \
                 rest of the file is as {} left it",
                names.join(", "),
                client.title()
            );
            if !forced.is_empty() {
                let names: Vec<String> = forced.iter().map(ToString::to_string).collect();
                let _ = writeln!(
                    out,
                    "  (--force: put back although changed since install: {})",
                    names.join(", ")
                );
            }
            text
        }
    };
    let restored = "the file was restored";
    if backup.steps.is_empty() {
        put_backup(registrar, &key, None, &path, out, restored)?;
    } else {
        put_backup(registrar, &key, Some(&backup), &path, out, restored)?;
        let clean = backup.steps.last().is_some_and(|earlier| {
            sha256(now.as_bytes()) == earlier.installed_sha256
                || earlier.rewritten.as_ref().is_some_and(|r| {
                    undo::changed(client, &r.installed, now, &r.entries)
                        .is_ok_and(|changed| changed.is_empty())
                })
        });
        let _ = writeln!(
            out,
            "  an earlier install of this file is kept too: `countersign uninstall --client \
             {client}` again undoes that one{}",
            if clean {
                ""
            } else {
                " (with --force: what it rewrote was changed after that install, and those \
                 changes would be lost)"
            }
        );
    }
    if !step.servers.is_empty() {
        let _ = writeln!(
            out,
            "  still registered in the desk: {} (`countersign server remove NAME` removes one, \
             after your approval in the desk)",
            step.servers.join(", ")
        );
    }
    Ok(())
}
