//! The files a person may edit, guarded: which they are, what an empty one says, how each is
//! checked, and how the desk reads and writes them (0600, whole or not at all).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use countersign_core::policy::Policy;
use countersign_engine::{ChangeKind, Engine};

use crate::error::RegistryError;
use crate::file::{FILE_NAME, Servers};

/// A file whose edits made outside the desk wait for the person's click.
#[derive(Debug, Clone, Copy)]
pub struct Guarded {
    /// Its name in the desk's config directory.
    pub name: &'static str,
    /// The kind of change an edit of it is.
    pub kind: ChangeKind,
    /// Checks a text of it (the engine knows what the servers list, which rules are checked
    /// against).
    pub check: fn(&Engine, &str) -> Result<(), RegistryError>,
}

impl Guarded {
    /// What applies when there is no file.
    pub fn default_text(self) -> String {
        if self.name == FILE_NAME {
            Servers::default().text()
        } else {
            String::new()
        }
    }
}

/// The registry of servers.
pub const SERVERS: Guarded = Guarded {
    name: FILE_NAME,
    kind: ChangeKind::Server,
    check: |_, text| Servers::parse(text).map(drop),
};

/// The policy.
pub const POLICY: Guarded = Guarded {
    name: "policy.toml",
    kind: ChangeKind::Policy,
    check: |_, text| {
        Policy::from_toml(text)
            .map(drop)
            .map_err(|e| RegistryError::Invalid {
                file: "policy.toml",
                reason: e.to_string(),
            })
    },
};

/// The rules over arguments, in Cedar: empty (or only comments and space) is no rules. Checked
/// against the tools every server lists now (a rule naming a tool none lists waits for it).
pub const RULES: Guarded = Guarded {
    name: "policy.cedar",
    kind: ChangeKind::Policy,
    check: |engine, text| match rules_in(text) {
        None => Ok(()),
        Some(text) => engine
            .check_rules(text)
            .map_err(|e| RegistryError::Invalid {
                file: "policy.cedar",
                reason: format!("{} ({})", e, e.code()),
            }),
    },
};

/// The rules a text of `policy.cedar` holds: `None` when it is empty.
pub fn rules_in(text: &str) -> Option<&str> {
    let bare = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default().trim())
        .all(str::is_empty);
    (!bare).then_some(text)
}

/// Whether `text` is shown to a person whole in a change (the window cuts what is longer): what
/// is applied must be what they could read.
pub(crate) fn showable(text: &str) -> bool {
    text.chars()
        .nth(countersign_engine::MAX_CHANGE_TEXT_CHARS)
        .is_none()
}

/// The most bytes read of a guarded file (more is an edit that is refused as invalid).
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// The file's text; `None` when there is none. A file too large, or not UTF-8, reads as a text
/// that fails its check.
pub(crate) fn read_file(path: &Path) -> std::io::Result<Option<String>> {
    use std::io::Read;
    // Only a regular file is read, and never through a link or a FIFO (which would block the
    // check, and everything waiting on it): anything else reads as a text that fails its check,
    // and the desk puts its own file back.
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Ok(Some("(not a regular file; not read)".to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Ok(Some(format!(
            "(the file is larger than {MAX_FILE_BYTES} bytes; not shown)"
        )));
    }
    Ok(Some(String::from_utf8(bytes).unwrap_or_else(|e| {
        format!(
            "(the file is not UTF-8 text: {} bytes; not shown)",
            e.as_bytes().len()
        )
    })))
}

/// Writes `text` to `path` whole: a temporary file beside it (0600), synced, renamed over it.
pub(crate) fn write_file(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    // A name nobody could have prepared (random, not the time), created new: a link planted at
    // a predictable name would otherwise have this write through it.
    let unguessable: u64 = rand::random();
    let temp = dir.join(format!(
        ".{name}.{}.{unguessable:016x}.tmp",
        std::process::id()
    ));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}
