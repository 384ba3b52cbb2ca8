//! `countersign serve` as a process for the benches (tests/examples): started on a free port of
//! loopback and known to listen from its own log line, killed when dropped; one JSON-RPC POST per
//! connection; the built-in tools' database; quantiles.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::group::Group;
use crate::ports::free_port;
use crate::window::bin;

/// A `countersign serve` child, killed with what it started when dropped, and by the kernel when
/// the bench ends without dropping it (an `exit` on a wrong answer): start it from the main
/// thread ([`Group`]).
pub struct Serve {
    process: Group,
    /// The agents' port.
    pub port: u16,
}

impl Serve {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }
}

/// `countersign-serve --listen 127.0.0.1:PORT ARGS` with `env`, once it listens (its stderr
/// read as it comes; `RUST_LOG=warn,serve=info`).
pub fn serve(args: &[&str], env: &[(&str, &str)]) -> Serve {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut process = Group::spawn(
        Command::new(bin("countersign-serve"))
            .arg("--listen")
            .arg(&listen)
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "warn,serve=info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )
    .expect("countersign-serve: build it first (cargo build -p countersign-serve)");
    let mut stderr = process.leader().stderr.take().unwrap();
    let (ready, told) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut seen, mut buf, mut said) = (Vec::new(), [0u8; 4096], false);
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            if !said && String::from_utf8_lossy(&seen).contains("listening on") {
                said = true;
                let _ = ready.send(());
            }
        }
    });
    told.recv_timeout(Duration::from_secs(60))
        .expect("the server did not start");
    Serve { process, port }
}

/// One JSON-RPC POST to `port`'s `/mcp` on a connection of its own, with `bearer` when given.
pub fn post(port: u16, body: &Value, bearer: Option<&str>) -> Value {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let body = body.to_string();
    let auth = bearer
        .map(|b| format!("Authorization: Bearer {b}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: \
         application/json\r\nAccept: application/json, text/event-stream\r\n{auth}Content-Length: \
         {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    serde_json::from_str(body).unwrap_or(Value::Null)
}

/// One HTTP/1.1 connection to `port`'s `/mcp`, kept alive across requests (as a client that
/// pools its connections does).
pub struct KeptAlive {
    stream: std::io::BufReader<TcpStream>,
    /// The `Authorization` header line each request carries, if any.
    auth: String,
}

impl KeptAlive {
    /// A connection to `port`.
    pub fn connect(port: u16) -> KeptAlive {
        Self::connect_as(port, None)
    }

    /// A connection to `port` whose requests carry `bearer` (an agent key).
    pub fn connect_as(port: u16, bearer: Option<&str>) -> KeptAlive {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_nodelay(true).unwrap();
        KeptAlive {
            stream: std::io::BufReader::new(stream),
            auth: bearer
                .map(|b| format!("Authorization: Bearer {b}\r\n"))
                .unwrap_or_default(),
        }
    }

    /// One JSON-RPC POST on this connection: the answer (its `Content-Length` body).
    pub fn post(&mut self, body: &Value) -> Value {
        use std::io::BufRead;
        let body = body.to_string();
        let request = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\n{}Content-Length: {}\r\n\r\n{body}",
            self.auth,
            body.len()
        );
        self.stream.get_mut().write_all(request.as_bytes()).unwrap();
        let mut length = None;
        loop {
            let mut line = String::new();
            if self.stream.read_line(&mut line).unwrap() == 0 {
                return Value::Null;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse::<usize>().ok();
            }
        }
        let mut answer = vec![0; length.expect("an answer without Content-Length")];
        self.stream.read_exact(&mut answer).unwrap();
        serde_json::from_slice(&answer).unwrap_or(Value::Null)
    }
}

/// A `tools/call` of `name` with `arguments`, as JSON-RPC.
pub fn call(name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
           "params": {"name": name, "arguments": arguments}})
}

/// The `q` quantile of `sorted`.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

/// `d` in microseconds.
pub fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The built-in tools' database in `dir`: one empty `notes` table.
pub fn tools_db(dir: &Path) -> PathBuf {
    let db = dir.join("tools.sqlite");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT);")
        .unwrap();
    db
}
