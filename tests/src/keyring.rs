//! A Secret Service of a test's own: a private D-Bus session bus with a throwaway, unlocked
//! gnome-keyring on it, which the test can take away while a desk uses it. (`.ci/with-keychain`
//! gives every test one shared keyring; killing that one would pull it from under the others.)
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The bus and the keyring daemon on it.
pub struct PrivateKeyring {
    dir: tempfile::TempDir,
    bus: Child,
    daemon: u32,
    /// `DBUS_SESSION_BUS_ADDRESS` for processes that should use it.
    pub address: String,
}

impl PrivateKeyring {
    /// Starts the bus and an unlocked keyring on it; waits until the keyring owns its name.
    pub fn start() -> PrivateKeyring {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["home", "data", "config", "cache", "run"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let run = dir.path().join("run");
        let conf = dir.path().join("session.conf");
        std::fs::write(
            &conf,
            format!(
                r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <keep_umask/>
  <listen>unix:dir={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"#,
                run.display()
            ),
        )
        .unwrap();
        let mut bus = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf.display()))
            .args(["--nofork", "--print-address=1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("dbus-daemon (run the tests through .ci/with-keychain, which installs it)");
        let mut address = String::new();
        BufReader::new(bus.stdout.take().unwrap())
            .read_line(&mut address)
            .unwrap();
        let address = address.trim().to_owned();
        let mut daemon = Command::new("gnome-keyring-daemon")
            .args(["--unlock", "--components=secrets"])
            .env("DBUS_SESSION_BUS_ADDRESS", &address)
            .env("HOME", dir.path().join("home"))
            .env("XDG_DATA_HOME", dir.path().join("data"))
            .env("XDG_CONFIG_HOME", dir.path().join("config"))
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .env("XDG_RUNTIME_DIR", &run)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("gnome-keyring-daemon");
        // A throwaway password for a throwaway keyring.
        daemon
            .stdin
            .take()
            .unwrap()
            .write_all(b"countersign-throwaway")
            .unwrap();
        let _ = daemon.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        let pid = loop {
            if let Some(pid) = owner_pid(&address) {
                break pid;
            }
            assert!(
                Instant::now() < deadline,
                "the keyring did not take its name in 10 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        PrivateKeyring {
            dir,
            bus,
            daemon: pid,
            address,
        }
    }

    /// Takes the Secret Service away: the keyring daemon is killed, the bus stays.
    pub fn kill_service(&mut self) {
        // SAFETY: a signal to the daemon this keyring started.
        unsafe {
            libc::kill(self.daemon as i32, libc::SIGKILL);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while owner_pid(&self.address).is_some() {
            assert!(Instant::now() < deadline, "the keyring did not go away");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PrivateKeyring {
    fn drop(&mut self) {
        // SAFETY: signals to processes this keyring started.
        unsafe {
            libc::kill(self.daemon as i32, libc::SIGKILL);
        }
        let _ = self.bus.kill();
        let _ = self.bus.wait();
        let _ = &self.dir;
    }
}

/// The pid of whoever owns the Secret Service name on the bus at `address`.
fn owner_pid(address: &str) -> Option<u32> {
    let out = Command::new("dbus-send")
        .args([
            &format!("--bus={address}"),
            "--print-reply",
            "--dest=org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus.GetConnectionUnixProcessID",
            "string:org.freedesktop.secrets",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .skip_while(|w| *w != "uint32")
        .nth(1)?
        .parse()
        .ok()
}
