//! Where the desk lives, for the account it runs under: its socket and its files.
//!
//! Both are computed from the account, its user id and its home directory as the password
//! database records it, never from `HOME` or `XDG_*`. A desk is often started by a gateway, which
//! is the agent's process: an agent that chose the desk's directories would choose its policy, its
//! settings and its ledger. One variable each overrides the two for tests and unusual setups,
//! [`SOCKET_ENV`] and [`DESK_DIR_ENV`], and a gateway passes neither to a desk it starts.
//!
//! The socket's directory is per user where the platform has one (`/run/user/<uid>` on Linux,
//! the per-user temporary directory on macOS). Where it has none, it is `/tmp/countersign-<uid>`,
//! in a directory every account can write to: there [`prepare_socket_dir`] refuses a directory
//! that another account owns or can write into, since whoever controls it could put their own
//! socket where gateways look for the desk.
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use std::ffi::{CStr, CString, OsString};
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The environment variable that overrides the socket's path (for tests and unusual setups).
pub const SOCKET_ENV: &str = "COUNTERSIGN_SOCKET";

/// The environment variable that puts the desk's files under one directory instead of the
/// account's own (`config/`, `data/` and `state/` under it): for tests, and for running a second
/// desk beside one's own. Read by the desk and by `countersign history`.
pub const DESK_DIR_ENV: &str = "COUNTERSIGN_DESK_DIR";

/// The socket file's name in its directory.
const SOCKET_FILE: &str = "desk.sock";

/// The desk's SQLite file's name in its data directory.
const STORE_FILE: &str = "desk.sqlite";

/// The built-in tools' default database's name in the desk's data directory.
const BUILTIN_DB_FILE: &str = "builtin.sqlite";

/// The name of the socket that accounts listed in the desk's settings connect to.
const AGENTS_SOCKET_FILE: &str = "agents.sock";

fn my_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Where the desk listens: `$COUNTERSIGN_SOCKET` if set, else [`default_socket_path`].
pub fn socket_path() -> PathBuf {
    socket_override().unwrap_or_else(default_socket_path)
}

/// `$COUNTERSIGN_SOCKET`, when set and not empty.
pub fn socket_override() -> Option<PathBuf> {
    std::env::var_os(SOCKET_ENV)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// The socket's path computed from the user id alone, so that a gateway whose environment the
/// agent's client stripped still finds the desk: `desk.sock` in `/run/user/<uid>/countersign`
/// where that runtime directory exists (Linux), in `countersign` under the per-user temporary
/// directory (macOS), else in `/tmp/countersign-<uid>`.
pub fn default_socket_path() -> PathBuf {
    per_user_dir()
        .unwrap_or_else(|| shared_dir(my_uid()))
        .join(SOCKET_FILE)
}

/// Where the desk listens for the accounts its settings list (an agent under an account of its
/// own): `agents.sock` beside `$COUNTERSIGN_SOCKET` when that is set, else in the shared
/// temporary directory's `countersign-<uid>`, which other accounts can reach (a per-user runtime
/// directory is closed to them).
pub fn agents_socket_path() -> PathBuf {
    match socket_override() {
        Some(path) => path.with_file_name(AGENTS_SOCKET_FILE),
        None => agents_socket_path_of(my_uid()),
    }
}

/// Where the desk of the account `uid` listens for the accounts its settings list.
pub fn agents_socket_path_of(uid: u32) -> PathBuf {
    shared_dir(uid).join(AGENTS_SOCKET_FILE)
}

/// `/tmp/countersign-<uid>`: the fallback in the temporary directory every account shares. Not
/// `$TMPDIR`: the gateway and the desk must agree without trusting either's environment.
fn shared_dir(uid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/countersign-{uid}"))
}

#[cfg(target_os = "macos")]
fn per_user_dir() -> Option<PathBuf> {
    // confstr returns the length needed, terminating NUL included; 0 on failure.
    // SAFETY: a null buffer of length 0 only asks for the length.
    let needed = unsafe { libc::confstr(libc::_CS_DARWIN_USER_TEMP_DIR, std::ptr::null_mut(), 0) };
    if needed == 0 {
        return None;
    }
    let mut buf = vec![0u8; needed];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
    let written = unsafe {
        libc::confstr(
            libc::_CS_DARWIN_USER_TEMP_DIR,
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if written == 0 || written > buf.len() {
        return None;
    }
    let dir = CStr::from_bytes_until_nul(&buf).ok()?.to_bytes().to_vec();
    let dir = PathBuf::from(OsString::from_vec(dir));
    dir.is_dir().then(|| dir.join("countersign"))
}

#[cfg(not(target_os = "macos"))]
fn per_user_dir() -> Option<PathBuf> {
    // Created by the login manager, owned by the user and closed to everyone else; an account
    // without a login session has none, and nobody but root can create one under /run/user.
    let runtime = PathBuf::from(format!("/run/user/{}", my_uid()));
    runtime.is_dir().then(|| runtime.join("countersign"))
}

/// Creates the socket's directory if needed, and makes sure nobody else controls it: a directory
/// that is a symbolic link, that another account owns, or that others can write into is refused
/// (whoever controls it could replace the desk's socket with their own). One that only this
/// account could ever write into is then given its mode: 0700, or 0711 when `reachable_by_others`
/// (other accounts may then pass through it to a socket they know the name of, never list it).
pub fn prepare_socket_dir(dir: &Path, reachable_by_others: bool) -> io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.mode(0o700);
    match builder.create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            builder.recursive(true).create(dir)?;
        }
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    let refuse = |why: String| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "refusing the socket directory {}: {why}; remove it, or set {SOCKET_ENV} to a \
                 path in a directory of your own",
                dir.display()
            ),
        ))
    };
    if meta.file_type().is_symlink() {
        return refuse("it is a symbolic link".into());
    }
    if !meta.is_dir() {
        return refuse("it is not a directory".into());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return refuse(format!(
            "it belongs to uid {}, not to this account (uid {me})",
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return refuse(format!(
            "its mode {mode:04o} lets other accounts write into it"
        ));
    }
    let wanted = if reachable_by_others { 0o711 } else { 0o700 };
    if mode != wanted {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(wanted))?;
    }
    Ok(())
}

/// The desk's directories: settings and policy, the SQLite file, the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeskDirs {
    /// Settings and policy.
    pub config: PathBuf,
    /// The SQLite file (ledger, approved arguments, history) and the built-in tools' default
    /// database.
    pub data: PathBuf,
    /// The log.
    pub state: PathBuf,
}

impl DeskDirs {
    /// `$COUNTERSIGN_DESK_DIR`'s `config/`, `data/` and `state/` when it is set, else
    /// [`DeskDirs::in_home`] of this account's home in the password database (never `$HOME`).
    pub fn locate() -> io::Result<DeskDirs> {
        if let Some(root) = std::env::var_os(DESK_DIR_ENV).filter(|d| !d.is_empty()) {
            return Ok(DeskDirs::under(Path::new(&root)));
        }
        let uid = my_uid();
        let home = account_home(uid)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "uid {uid} has no home directory in the password database: set \
                     {DESK_DIR_ENV} to a directory for the desk's files"
                ),
            )
        })?;
        Ok(DeskDirs::in_home(&home))
    }

    /// `config/`, `data/` and `state/` under `root`.
    pub fn under(root: &Path) -> DeskDirs {
        DeskDirs {
            config: root.join("config"),
            data: root.join("data"),
            state: root.join("state"),
        }
    }

    /// The platform's places in `home`: `~/.config/countersign`, `~/.local/share/countersign`
    /// and `~/.local/state/countersign` (the XDG defaults), or on macOS
    /// `~/Library/Application Support/countersign` for both settings and data and
    /// `~/Library/Logs/countersign` for the log.
    pub fn in_home(home: &Path) -> DeskDirs {
        if cfg!(target_os = "macos") {
            let support = home.join("Library/Application Support/countersign");
            DeskDirs {
                config: support.clone(),
                data: support,
                state: home.join("Library/Logs/countersign"),
            }
        } else {
            DeskDirs {
                config: home.join(".config/countersign"),
                data: home.join(".local/share/countersign"),
                state: home.join(".local/state/countersign"),
            }
        }
    }

    /// The desk's SQLite file.
    pub fn store(&self) -> PathBuf {
        DeskDirs::store_in(&self.data)
    }

    /// The desk's SQLite file in the data directory `data`: the one place its name is spelled,
    /// for a host that keeps the directories in a type of its own.
    pub fn store_in(data: &Path) -> PathBuf {
        data.join(STORE_FILE)
    }

    /// The built-in tools' default database (`countersign mcp` with neither a server nor `--db`).
    pub fn builtin_db(&self) -> PathBuf {
        self.data.join(BUILTIN_DB_FILE)
    }
}

/// The home directory of account `uid` in the password database (`None`: no entry, or an empty
/// home field).
pub fn account_home(uid: u32) -> io::Result<Option<PathBuf>> {
    Ok(lookup(Key::Uid(uid))?.and_then(|a| a.home))
}

/// The user id of an account given by name or as a number (`None`: no such account).
pub fn account_uid(account: &str) -> io::Result<Option<u32>> {
    if let Ok(uid) = account.parse::<u32>() {
        return Ok(Some(uid));
    }
    let Ok(name) = CString::new(account) else {
        return Ok(None);
    };
    Ok(lookup(Key::Name(name))?.map(|a| a.uid))
}

enum Key {
    Uid(u32),
    Name(CString),
}

struct Account {
    uid: u32,
    home: Option<PathBuf>,
}

/// One password-database entry, through the re-entrant calls (the desk has threads).
fn lookup(key: Key) -> io::Result<Option<Account>> {
    let mut size = 1024usize;
    loop {
        let mut buf = vec![0u8; size];
        // SAFETY: `passwd` is plain data; zeroes are a valid (empty) value for every field.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let (entry_ptr, buf_ptr, len) =
            (&mut entry as *mut libc::passwd, buf.as_mut_ptr(), buf.len());
        let r = match &key {
            // SAFETY: the entry, the buffer (of `len` bytes) and `found` are valid for writes
            // for the whole call.
            Key::Uid(uid) => unsafe {
                libc::getpwuid_r(*uid, entry_ptr, buf_ptr.cast(), len, &mut found)
            },
            // SAFETY: as above, and the name is a NUL-terminated string.
            Key::Name(name) => unsafe {
                libc::getpwnam_r(name.as_ptr(), entry_ptr, buf_ptr.cast(), len, &mut found)
            },
        };
        if r == libc::ERANGE && size < 1 << 20 {
            size *= 4;
            continue;
        }
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        if found.is_null() {
            return Ok(None);
        }
        let home = if entry.pw_dir.is_null() {
            None
        } else {
            // SAFETY: a non-null pw_dir points at a NUL-terminated string inside `buf`, alive here.
            let dir = unsafe { CStr::from_ptr(entry.pw_dir) }.to_bytes().to_vec();
            (!dir.is_empty()).then(|| PathBuf::from(OsString::from_vec(dir)))
        };
        return Ok(Some(Account {
            uid: entry.pw_uid,
            home,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_accounts_home_comes_from_the_password_database_not_the_environment() {
        let uid = my_uid();
        let home = account_home(uid).unwrap();
        // Root and ordinary accounts alike have an entry on any machine the tests run on.
        let home = home.expect("an entry for this account");
        assert!(home.is_absolute(), "{}", home.display());
        assert_eq!(account_uid(&uid.to_string()).unwrap(), Some(uid));
        assert_eq!(account_uid("root").unwrap(), Some(0));
        assert_eq!(account_uid("no-such-account-countersign").unwrap(), None);
        assert_eq!(account_uid("nul\0inside").unwrap(), None);
    }

    #[test]
    fn desk_dirs_are_the_platforms_defaults_or_one_directory_for_tests() {
        let dirs = DeskDirs::in_home(Path::new("/home/ada"));
        if cfg!(target_os = "macos") {
            assert_eq!(
                dirs.data,
                Path::new("/home/ada/Library/Application Support/countersign")
            );
        } else {
            assert_eq!(dirs.config, Path::new("/home/ada/.config/countersign"));
            assert_eq!(dirs.data, Path::new("/home/ada/.local/share/countersign"));
            assert_eq!(dirs.state, Path::new("/home/ada/.local/state/countersign"));
        }
        let dirs = DeskDirs::under(Path::new("/t"));
        assert_eq!(
            (dirs.config, dirs.data, dirs.state.clone()),
            ("/t/config".into(), "/t/data".into(), "/t/state".into())
        );
        assert_eq!(
            DeskDirs::under(Path::new("/t")).store(),
            Path::new("/t/data/desk.sqlite")
        );
        assert_eq!(
            DeskDirs::store_in(Path::new("/t/data")),
            DeskDirs::under(Path::new("/t")).store()
        );
        assert_eq!(
            DeskDirs::under(Path::new("/t")).builtin_db(),
            Path::new("/t/data/builtin.sqlite")
        );
    }

    fn temp() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "countersign-place-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir(&dir).unwrap();
        dir
    }

    fn mode(dir: &Path) -> u32 {
        std::fs::metadata(dir).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_new_socket_directory_is_0700_or_0711_when_other_accounts_connect() {
        let root = temp();
        let dir = root.join("a/b");
        prepare_socket_dir(&dir, false).unwrap();
        assert_eq!(mode(&dir), 0o700);
        prepare_socket_dir(&dir, true).unwrap();
        assert_eq!(mode(&dir), 0o711);
        prepare_socket_dir(&dir, false).unwrap();
        assert_eq!(mode(&dir), 0o700);
        // One of ours that nobody else could write into is tightened, not refused.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare_socket_dir(&dir, false).unwrap();
        assert_eq!(mode(&dir), 0o700);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_socket_directory_others_can_write_into_or_a_link_is_refused() {
        let root = temp();
        for bad in [0o777, 0o770, 0o1777, 0o702] {
            let dir = root.join(format!("m{bad:o}"));
            std::fs::create_dir(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(bad)).unwrap();
            let err = prepare_socket_dir(&dir, false).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
            assert!(
                err.to_string()
                    .contains("lets other accounts write into it"),
                "{err}"
            );
            assert_eq!(mode(&dir), bad, "a refused directory is left as it was");
        }
        let target = root.join("target");
        std::fs::create_dir(&target).unwrap();
        std::os::unix::fs::symlink(&target, root.join("link")).unwrap();
        let err = prepare_socket_dir(&root.join("link"), false).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_socket_directory_of_another_account_is_refused() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("skipped: giving a directory to another account needs root");
            return;
        }
        let root = temp();
        let dir = root.join("theirs");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        let err = prepare_socket_dir(&dir, false).unwrap_err();
        assert!(err.to_string().contains("belongs to uid 65534"), "{err}");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn the_agents_socket_is_reachable_by_other_accounts() {
        let path = agents_socket_path_of(1000);
        assert_eq!(path, Path::new("/tmp/countersign-1000/agents.sock"));
    }
}
