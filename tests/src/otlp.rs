//! An OpenTelemetry collector for the tests: it takes OTLP logs over HTTP/protobuf (`POST
//! /v1/logs`), decodes each request with the OpenTelemetry project's own messages, and keeps every
//! log record it acknowledged, in arrival order. It can be taken down (its port closed, what
//! arrives refused) and brought back on the same port, to test that events wait and then arrive
//! once each. Plain HTTP/1.1 over a tokio listener: a collector that answers is all a sender
//! needs, and the bytes it receives are decoded exactly.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use prost::Message;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// What the collector received.
#[derive(Default)]
struct Received {
    records: Mutex<Vec<LogRecord>>,
    requests: Mutex<Vec<ExportLogsServiceRequest>>,
    arrived: Notify,
}

/// A collector listening on 127.0.0.1 (see the module's doc).
pub struct Collector {
    addr: SocketAddr,
    received: Arc<Received>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Collector {
    /// A collector on a free port.
    pub async fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Received::default());
        let task = Some(tokio::spawn(serve(listener, received.clone())));
        Collector {
            addr,
            received,
            task,
        }
    }

    /// The endpoint senders post to.
    pub fn endpoint(&self) -> String {
        format!("http://{}/v1/logs", self.addr)
    }

    /// Closes the port: senders meet a refused connection until [`Collector::up`].
    pub fn down(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Listens again on the same port.
    pub async fn up(&mut self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.task = Some(tokio::spawn(serve(listener, self.received.clone())));
    }

    /// Every record acknowledged so far, in arrival order.
    pub fn records(&self) -> Vec<LogRecord> {
        self.received.records.lock().unwrap().clone()
    }

    /// Every request acknowledged so far.
    pub fn requests(&self) -> Vec<ExportLogsServiceRequest> {
        self.received.requests.lock().unwrap().clone()
    }

    /// Waits until at least `n` records arrived (panics after `within`), woken by each arrival.
    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<LogRecord> {
        let waited = tokio::time::timeout(within, async {
            loop {
                let arrived = self.received.arrived.notified();
                let records = self.records();
                if records.len() >= n {
                    return records;
                }
                arrived.await;
            }
        })
        .await;
        waited.unwrap_or_else(|_| {
            panic!(
                "{n} records did not arrive in {within:?}: {} did",
                self.records().len()
            )
        })
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.down();
    }
}

/// A record's string or integer attribute `key`, as text.
pub fn attribute(record: &LogRecord, key: &str) -> Option<String> {
    let value = record
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The chain numbers of `records`, in order.
pub fn seqs(records: &[LogRecord]) -> Vec<u64> {
    records
        .iter()
        .map(|r| {
            attribute(r, "countersign.seq")
                .expect("every record carries its chain number")
                .parse()
                .unwrap()
        })
        .collect()
}

async fn serve(listener: TcpListener, received: Arc<Received>) {
    // Aborting this task drops the set, which aborts every connection: down is down.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let received = received.clone();
        connections.spawn(async move {
            let mut stream = BufReader::new(stream);
            // One request after another on the connection (senders keep it alive).
            loop {
                let mut length = None;
                let mut line = String::new();
                let mut first = true;
                loop {
                    line.clear();
                    if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    if first {
                        assert!(line.starts_with("POST /v1/logs "), "{line}");
                        first = false;
                    }
                    let header = line.trim_end();
                    if header.is_empty() {
                        break;
                    }
                    if let Some((name, value)) = header.split_once(':')
                        && name.eq_ignore_ascii_case("content-length")
                    {
                        length = value.trim().parse::<usize>().ok();
                    }
                }
                let mut body = vec![0; length.expect("a body with its length")];
                stream.read_exact(&mut body).await.unwrap();
                let request = ExportLogsServiceRequest::decode(body.as_slice())
                    .expect("the body is an OTLP logs request");
                {
                    let mut records = received.records.lock().unwrap();
                    for resource in &request.resource_logs {
                        for scope in &resource.scope_logs {
                            records.extend(scope.log_records.iter().cloned());
                        }
                    }
                    received.requests.lock().unwrap().push(request);
                }
                let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                if stream.get_mut().write_all(answer).await.is_err() {
                    return;
                }
                received.arrived.notify_waiters();
            }
        });
    }
}
