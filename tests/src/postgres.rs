//! PostgreSQL for the records tests: the shared throwaway server `.ci/with-postgres` starts, a
//! fresh database per test on it (empty, or with the records' schema), a private server for the tests that stop or freeze one, and a
//! fault proxy that cuts a connection after a spend is sent.
//!
//! Tests that need PostgreSQL are `#[ignore]`d (CI runs them under `.ci/with-postgres`) and FAIL,
//! never pass, when run without it: [`shared_dsn`] panics with what to do. Stopping or freezing
//! the shared server would break every other test running at the same moment, so the fault tests
//! start a private server of their own with the same recipe as the script.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ports::free_port;

use countersign_store::{Postgres, PostgresOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The variable `.ci/with-postgres` sets to the shared server's DSN.
pub const DSN_VARIABLE: &str = "COUNTERSIGN_TEST_POSTGRES";

/// Why a PostgreSQL test is ignored unless asked for.
pub const NEEDS_POSTGRES: &str = "needs PostgreSQL: run under .ci/with-postgres";

/// The shared server's DSN (no database named), or a panic saying how to get one.
pub fn shared_dsn() -> String {
    std::env::var(DSN_VARIABLE).unwrap_or_else(|_| {
        panic!(
            "{DSN_VARIABLE} is not set: this test needs PostgreSQL. Run it under \
             .ci/with-postgres, e.g. `.ci/with-postgres cargo nextest run -p countersign-tests \
             --run-ignored all`"
        )
    })
}

/// A connection for the test's own statements (creating databases, triggers, finding
/// backends), its connection driven on the current runtime.
pub async fn admin(dsn: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|err| panic!("cannot connect to the test server ({dsn}): {err}"));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A new, empty database on the server of `server_dsn`; answers its DSN.
pub async fn fresh_database(server_dsn: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let name = format!(
        "cs_{}_{}_{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    admin(server_dsn)
        .await
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap_or_else(|err| panic!("CREATE DATABASE {name}: {err}"));
    format!("{server_dsn} dbname={name}")
}

/// A new database on the shared server.
pub async fn shared_database() -> String {
    fresh_database(&shared_dsn()).await
}

/// A new database on the shared server with the records' schema already in it (a [`Postgres`]
/// connected once and dropped), for a test whose race or fault must not include the migration,
/// or that changes the schema itself.
pub async fn migrated_database() -> String {
    let dsn = shared_database().await;
    drop(
        Postgres::connect(&dsn, PostgresOptions::default())
            .await
            .unwrap_or_else(|err| panic!("migrating a fresh database: {err}")),
    );
    dsn
}

/// Waits until `ready` holds, checking every few milliseconds, or panics after `deadline` with
/// `what`.
pub fn wait_until(what: &str, deadline: Duration, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(
            started.elapsed() < deadline,
            "{what}: not within {deadline:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A PostgreSQL server of the test's own, on a free loopback port, stopped and removed on drop.
#[derive(Debug)]
pub struct PrivateServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    /// `runuser -u postgres --` when running as root (postgres refuses root).
    as_postgres: bool,
}

impl PrivateServer {
    /// Initialises and starts a server (as `.ci/with-postgres` does).
    pub fn start() -> PrivateServer {
        let bin = PathBuf::from(
            std::env::var("COUNTERSIGN_TEST_POSTGRES_BIN")
                .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into()),
        );
        assert!(
            bin.join("initdb").exists(),
            "no initdb in {}: run under .ci/with-postgres, which installs PostgreSQL",
            bin.display()
        );
        // SAFETY: geteuid has no preconditions.
        let as_postgres = unsafe { libc::geteuid() } == 0;
        let dir = tempfile::tempdir().unwrap();
        if as_postgres {
            run(Command::new("chown").arg("postgres:").arg(dir.path()));
        }
        let server = PrivateServer {
            dir,
            bin,
            port: free_port(),
            as_postgres,
        };
        let data = server.data();
        run(server.command("initdb").arg("-D").arg(&data).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]));
        server.start_again();
        server
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }

    /// Starts the (stopped) server, waiting until it accepts connections.
    pub fn start_again(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=100",
            self.port,
            self.dir.path().display()
        );
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("log"))
            .args(["-w", "-t", "60", "-o", &options, "start"]));
    }

    /// Stops the server as a crash would (`pg_ctl stop -m immediate`), waiting until it is gone.
    pub fn stop_immediately(&self) {
        run(self.command("pg_ctl").arg("-D").arg(self.data()).args([
            "-m",
            "immediate",
            "-w",
            "stop",
        ]));
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The DSN of the server's superuser (no database named).
    pub fn dsn(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres", self.port)
    }

    /// The server's log, for a failure message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// Where the server's files are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        if self.data().join("postmaster.pid").exists() {
            let _ = self
                .command("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "-w", "stop"])
                .output();
        }
    }
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|err| panic!("cannot run {command:?}: {err}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A TCP proxy on loopback in front of a server that forwards bytes both ways until it is armed;
/// armed, the first chunk a client sends that contains `needle` is forwarded to the server, and
/// then both sides are closed without relaying the server's answer: a connection lost after the
/// statement was sent and before its outcome came back. Armed to stall ([`FaultProxy::arm_stalling`]),
/// it keeps both sides open instead and relays nothing more: an answer that never comes.
#[derive(Debug)]
pub struct FaultProxy {
    port: u16,
    /// What every proxied connection reads, shared with them.
    fault: Fault,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy to `127.0.0.1:server_port`, disarmed, cutting on `needle` when armed.
    pub async fn start(server_port: u16, needle: &'static [u8]) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let fault = Fault {
            needle: Arc::new(Mutex::new(needle.to_vec())),
            armed: Arc::default(),
            stalling: Arc::default(),
            cuts: Arc::default(),
        };
        let shared = fault.clone();
        let task = tokio::spawn(async move {
            // The connections' relays, aborted with this task when the proxy is dropped: a
            // stalled one would otherwise hold its server connection for as long as its client.
            let mut sessions = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                while sessions.try_join_next().is_some() {}
                let fault = shared.clone();
                sessions.spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)).await {
                        session(client, server, fault).await;
                    }
                });
            }
        });
        FaultProxy { port, fault, task }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cut the next connection that sends the needle.
    pub fn arm(&self) {
        self.fault.stalling.store(false, Ordering::SeqCst);
        self.fault.armed.store(true, Ordering::SeqCst);
    }

    /// Stall the next connection that sends the needle: the chunk reaches the server, and
    /// nothing more goes either way on that connection while the client keeps it open (as
    /// from a backend frozen once the statement arrived). Counted as a cut.
    pub fn arm_stalling(&self) {
        self.fault.stalling.store(true, Ordering::SeqCst);
        self.fault.armed.store(true, Ordering::SeqCst);
    }

    /// Cut the next connection that sends `needle` (from now on the proxy's needle): for bytes
    /// known only once the test has run a while, such as a nonce (a statement prepared once per
    /// connection sends its text only the first time).
    pub fn arm_on(&self, needle: &[u8]) {
        *countersign_core::sync::lock(&self.fault.needle) = needle.to_vec();
        self.arm();
    }

    /// Forward everything.
    pub fn disarm(&self) {
        self.fault.armed.store(false, Ordering::SeqCst);
    }

    /// How many connections were cut.
    pub fn cuts(&self) -> usize {
        *countersign_core::sync::lock(&self.fault.cuts)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the proxy's connections are told: the needle, whether and how to fail on it, and how
/// many failed. Clones share it.
#[derive(Debug, Clone)]
struct Fault {
    needle: Arc<Mutex<Vec<u8>>>,
    armed: Arc<AtomicBool>,
    stalling: Arc<AtomicBool>,
    cuts: Arc<Mutex<usize>>,
}

async fn session(client: TcpStream, server: TcpStream, fault: Fault) {
    let Fault {
        needle,
        armed,
        stalling,
        cuts,
    } = fault;
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // The answers' relay gives the client's write half back when told to stop, so that stopping
    // it does not close the client's side: the client must see the connection end only after
    // the cut is counted and the statement was handed to the server.
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let answers = tokio::spawn(async move {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            tokio::select! {
                biased;
                _ = &mut stopped => break,
                read = server_read.read(&mut buffer) => match read {
                    Ok(0) | Err(_) => {
                        let _ = client_write.shutdown().await;
                        break;
                    }
                    Ok(n) => {
                        if client_write.write_all(&buffer[..n]).await.is_err() {
                            break;
                        }
                    }
                },
            }
        }
        client_write
    });
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match client_read.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &buffer[..n];
        let cut = armed.load(Ordering::SeqCst) && {
            let needle = countersign_core::sync::lock(&needle);
            !needle.is_empty() && chunk.windows(needle.len()).any(|w| w == &needle[..])
        };
        if cut {
            // Nothing of the answer may reach the client: stop relaying first, then send.
            let _ = stop.send(());
            let client_write = answers.await;
            let _ = server_write.write_all(chunk).await;
            let _ = server_write.flush().await;
            armed.store(false, Ordering::SeqCst);
            *countersign_core::sync::lock(&cuts) += 1;
            if stalling.load(Ordering::SeqCst) {
                // Open both ways, silent: whatever the client sends goes nowhere, until it
                // closes its side.
                while let Ok(n) = client_read.read(&mut buffer).await {
                    if n == 0 {
                        break;
                    }
                }
            }
            // Dropping both halves of both sockets closes both connections.
            drop((client_write, server_write));
            return;
        }
        if server_write.write_all(chunk).await.is_err() {
            break;
        }
    }
    drop(stop);
    let _ = answers.await;
}
