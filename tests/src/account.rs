//! A throwaway OS account, for tests about what another account can and cannot do: an agent
//! under an account of its own, a desk started under a fresh account, a desk another process of
//! its account cannot read. Creating one needs root (CI runs as root); elsewhere these tests say
//! why they skip and pass.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh account with a home directory, removed (home included) when dropped.
#[derive(Debug)]
pub struct Account {
    /// Its name.
    pub name: String,
    /// Its user id.
    pub uid: u32,
    /// Its primary group id.
    pub gid: u32,
    /// Its home directory, as the password database records it.
    pub home: PathBuf,
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn sbin(tool: &str) -> PathBuf {
    let path = Path::new("/usr/sbin").join(tool);
    if path.exists() {
        path
    } else {
        PathBuf::from(tool)
    }
}

fn id(flag: &str, name: &str) -> u32 {
    let out = Command::new("id").arg(flag).arg(name).output().unwrap();
    assert!(out.status.success(), "id {flag} {name}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

impl Account {
    /// Creates a fresh account, or returns `None` after printing why not (not root, no
    /// `useradd`): the caller then skips.
    pub fn create(what: &str) -> Option<Account> {
        if !is_root() {
            println!("skipped ({what}): creating a second account needs root (CI runs as root)");
            return None;
        }
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "cs-t{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let made = Command::new(sbin("useradd"))
            .args(["--create-home", "--shell", "/bin/sh", "--user-group", &name])
            .output();
        match made {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!("useradd {name}: {}", String::from_utf8_lossy(&out.stderr)),
            Err(e) => {
                println!("skipped ({what}): no useradd here ({e})");
                return None;
            }
        }
        let uid = id("-u", &name);
        let gid = id("-g", &name);
        let home = countersign_wire::account_home(uid)
            .unwrap()
            .expect("a home in the password database");
        Some(Account {
            name,
            uid,
            gid,
            home,
        })
    }

    /// `program` as this account: its uid and gid, no other groups, an environment of PATH
    /// only (callers add what the scenario needs), in its home.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(program);
        cmd.uid(self.uid)
            .gid(self.gid)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .current_dir(&self.home);
        cmd
    }

    /// [`Account::command`], blocking.
    pub fn std_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(program);
        cmd.uid(self.uid)
            .gid(self.gid)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .current_dir(&self.home);
        cmd
    }

    /// Gives `path` (and everything under it) to this account.
    pub fn give(&self, path: &Path) {
        let out = Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", self.uid, self.gid))
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "chown: {out:?}");
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        // The socket directory a desk of this account made in the shared temporary directory.
        let _ = std::fs::remove_dir_all(format!("/tmp/countersign-{}", self.uid));
        let out = Command::new(sbin("userdel"))
            .args(["--remove", &self.name])
            .output();
        if let Ok(out) = out
            && !out.status.success()
        {
            eprintln!(
                "userdel {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Every file (not directory) under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() && !path.is_symlink() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}
