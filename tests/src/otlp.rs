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

/// What the collector answers each request: a status and a body.
struct Answer {
    status: u16,
    body: Vec<u8>,
}

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
    answer: Arc<Answer>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Collector {
    /// A collector on a free port that takes every request (`200`, an empty body).
    pub async fn start() -> Collector {
        Collector::answering(200, Vec::new()).await
    }

    /// A collector on a free port that answers every request with `status` and `body` (a hostile
    /// or failing one); what it decodes is kept all the same.
    pub async fn answering(status: u16, body: Vec<u8>) -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Received::default());
        let answer = Arc::new(Answer { status, body });
        let task = Some(tokio::spawn(serve(
            listener,
            received.clone(),
            answer.clone(),
        )));
        Collector {
            addr,
            received,
            answer,
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
        self.task = Some(tokio::spawn(serve(
            listener,
            self.received.clone(),
            self.answer.clone(),
        )));
    }

    /// Every record received so far (acknowledged, unless the collector was told to refuse), in
    /// arrival order.
    pub fn records(&self) -> Vec<LogRecord> {
        countersign_core::sync::lock(&self.received.records).clone()
    }

    /// Every request acknowledged so far.
    pub fn requests(&self) -> Vec<ExportLogsServiceRequest> {
        countersign_core::sync::lock(&self.received.requests).clone()
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

async fn serve(listener: TcpListener, received: Arc<Received>, answer: Arc<Answer>) {
    // Aborting this task drops the set, which aborts every connection: down is down.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let (received, answer) = (received.clone(), answer.clone());
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
                    let mut records = countersign_core::sync::lock(&received.records);
                    for resource in &request.resource_logs {
                        for scope in &resource.scope_logs {
                            records.extend(scope.log_records.iter().cloned());
                        }
                    }
                    countersign_core::sync::lock(&received.requests).push(request);
                }
                // Kept before it is answered: a sender may leave without reading the answer.
                received.arrived.notify_waiters();
                let head = format!(
                    "HTTP/1.1 {} X\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
                    answer.status,
                    answer.body.len()
                );
                let out = stream.get_mut();
                if out.write_all(head.as_bytes()).await.is_err()
                    || out.write_all(&answer.body).await.is_err()
                {
                    return;
                }
            }
        });
    }
}
