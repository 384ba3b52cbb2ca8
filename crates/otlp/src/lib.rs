//! Confirm events sent to an OpenTelemetry collector, so a security team finds Countersign's
//! record beside the rest of its telemetry.
//!
//! Why a crate of its own: the desk and `countersign serve` both send, from the same records, and
//! neither should carry the other. Why not the OpenTelemetry SDK's log pipeline: its batch
//! processor keeps records in memory and drops them when its queue is full or the process ends,
//! and the seed says of these events "never sampled, never dropped". So nothing is queued in
//! memory here. Every event is already in history, chained; a [`Sender`] reads the events after
//! the sink's cursor (kept in the same records), posts them as one OTLP `ExportLogsServiceRequest`
//! (HTTP/protobuf, the messages of the OpenTelemetry project's own `opentelemetry-proto`), and
//! moves the cursor only when the collector answered 2xx. A collector that is down makes events
//! wait, in order, across restarts; the window and `countersign history` say how many
//! ([`countersign_store::ExportStatus`]). A sender that dies after the collector took a batch and
//! before the cursor moved sends that batch again: each record carries its chain number
//! (`countersign.seq`), so a collector can drop what it has. One sender per sink at a time (a
//! lease in the records), so the replicas of a team's server do not each send everything.
//!
//! What a record carries: the event's kind, its refusal or rejection code, the outcome, tool,
//! target, tenant, plan hash, nonce, note, and its place in the chain (`countersign.seq`,
//! `countersign.chain.prev`, `countersign.chain.hash`). Never a token (an event has none), a
//! secret, or an argument: events hold no arguments.
#![forbid(unsafe_code)] // nothing here reaches past the safe language; keep it so

use countersign_core::clock::Clock;
use countersign_core::sync::lock;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::telemetry::EventKind;
use countersign_store::{Recorded, Records};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use tokio_util::sync::CancellationToken;

/// The sink's name in the records: one collector per authority.
pub const SINK: &str = countersign_store::OTLP_SINK;

/// The most events posted at once.
pub const BATCH: u32 = 512;

/// How long a sender's claim on the sink lasts without being renewed.
const LEASE_MS: u64 = 15_000;

/// How often an idle sender looks for new events.
const IDLE: Duration = Duration::from_millis(250);

/// The shortest and longest pause after a failed send (doubling in between).
const MIN_PAUSE: Duration = Duration::from_millis(250);
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// The most of a collector's answer read (its partial-success message is small).
const MAX_ANSWER: usize = 64 * 1024;

/// At most `limit` bytes of `answer`'s body, or none when it is longer (or breaks off).
async fn first_bytes(mut answer: reqwest::Response, limit: usize) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = answer.chunk().await.ok()? {
        if body.len() + chunk.len() > limit {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    Some(body)
}

/// How long one post may take.
const POST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a collector cannot be used as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CollectorError {
    /// The endpoint is not an `http://` or `https://` URL.
    #[error("the OTLP endpoint {0:?} is not an http:// or https:// URL")]
    BadEndpoint(String),
    /// A header given for the collector is not `name=value`, or not a valid HTTP header.
    #[error("an OTLP header is not name=value with a valid name and value (header {0})")]
    BadHeader(usize),
}

/// Where the events go, and how to present to the collector.
#[derive(Clone)]
pub struct Collector {
    endpoint: reqwest::Url,
    /// Often an API key: never printed.
    headers: reqwest::header::HeaderMap,
    service: String,
    instance: String,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("endpoint", &self.endpoint_text())
            .field("headers", &self.headers.len())
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl Collector {
    /// A collector receiving OTLP logs at `endpoint` (the full URL, such as
    /// `http://127.0.0.1:4318/v1/logs`), from `service` (`countersign-desk`,
    /// `countersign-serve`) instance `instance`.
    pub fn new(endpoint: &str, service: &str, instance: &str) -> Result<Self, CollectorError> {
        let url = reqwest::Url::parse(endpoint.trim())
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| CollectorError::BadEndpoint(endpoint.to_owned()))?;
        Ok(Collector {
            endpoint: url,
            headers: reqwest::header::HeaderMap::new(),
            service: service.to_owned(),
            instance: instance.to_owned(),
        })
    }

    /// The collector the standard variables name, if any: `OTEL_EXPORTER_OTLP_LOGS_ENDPOINT` (the
    /// full URL), else `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/logs` added; headers from
    /// `OTEL_EXPORTER_OTLP_LOGS_HEADERS` or `OTEL_EXPORTER_OTLP_HEADERS` (`name=value,…`, values
    /// percent-decoded). `var` reads a variable.
    pub fn from_env(
        var: impl Fn(&str) -> Option<String>,
        service: &str,
        instance: &str,
    ) -> Result<Option<Self>, CollectorError> {
        let endpoint = match var("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT").filter(|v| !v.is_empty()) {
            Some(full) => full,
            None => match var("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|v| !v.is_empty()) {
                Some(base) => format!("{}/v1/logs", base.trim_end_matches('/')),
                None => return Ok(None),
            },
        };
        let mut collector = Collector::new(&endpoint, service, instance)?;
        if let Some(headers) = var("OTEL_EXPORTER_OTLP_LOGS_HEADERS")
            .or_else(|| var("OTEL_EXPORTER_OTLP_HEADERS"))
            .filter(|v| !v.is_empty())
        {
            collector = collector.with_headers(&headers)?;
        }
        Ok(Some(collector))
    }

    /// This collector with the headers of `list` (`name=value,…`, values percent-decoded).
    pub fn with_headers(mut self, list: &str) -> Result<Self, CollectorError> {
        for (i, pair) in list.split(',').enumerate() {
            let (name, value) = pair
                .split_once('=')
                .ok_or(CollectorError::BadHeader(i + 1))?;
            let name = reqwest::header::HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| CollectorError::BadHeader(i + 1))?;
            let decoded = percent_decode(value.trim()).ok_or(CollectorError::BadHeader(i + 1))?;
            let mut value = reqwest::header::HeaderValue::from_str(&decoded)
                .map_err(|_| CollectorError::BadHeader(i + 1))?;
            value.set_sensitive(true);
            self.headers.insert(name, value);
        }
        Ok(self)
    }

    /// The endpoint as it may be shown: without credentials or query.
    pub fn endpoint_text(&self) -> String {
        let mut shown = self.endpoint.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        shown.set_query(None);
        shown.to_string()
    }
}

/// `%XX` decoded, as the OTLP exporter specification asks of header values.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn text(value: impl Into<String>) -> Option<AnyValue> {
    Some(AnyValue {
        value: Some(any_value::Value::StringValue(value.into())),
    })
}

fn attribute(key: &str, value: Option<AnyValue>) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    }
}

/// One event as an OTLP log record; `now_ms` is when it was sent (its observed time).
pub fn log_record(recorded: &Recorded, now_ms: u64) -> LogRecord {
    let event = &recorded.event;
    let (kind, code, ok) = event.kind.columns();
    let security = event.kind.is_security_event() || matches!(event.kind, EventKind::Denied);
    let (severity, severity_text) = if security {
        (SeverityNumber::Warn, "WARN")
    } else {
        (SeverityNumber::Info, "INFO")
    };
    let mut attributes = vec![
        attribute("countersign.event", text(kind)),
        attribute("countersign.tool", text(event.tool.as_str())),
        attribute("countersign.tenant", text(event.tenant.as_str())),
    ];
    let mut optional = |key: &str, value: Option<AnyValue>| {
        if value.is_some() {
            attributes.push(attribute(key, value));
        }
    };
    optional("countersign.code", code.and_then(text));
    optional(
        "countersign.ok",
        ok.map(|ok| AnyValue {
            value: Some(any_value::Value::BoolValue(ok)),
        }),
    );
    optional("countersign.target", event.target.clone().and_then(text));
    optional(
        "countersign.plan_hash",
        event.plan.map(|p| p.to_hex()).and_then(text),
    );
    optional(
        "countersign.nonce",
        event.nonce.map(|n| n.to_hex()).and_then(text),
    );
    optional("countersign.note", event.note.clone().and_then(text));
    if let Some(chained) = recorded.chained {
        optional(
            "countersign.seq",
            Some(AnyValue {
                value: Some(any_value::Value::IntValue(
                    i64::try_from(chained.seq).unwrap_or(i64::MAX),
                )),
            }),
        );
        optional("countersign.chain.prev", text(chained.prev.to_hex()));
        optional("countersign.chain.hash", text(chained.hash.to_hex()));
    }
    LogRecord {
        time_unix_nano: event.at_ms.saturating_mul(1_000_000),
        observed_time_unix_nano: now_ms.saturating_mul(1_000_000),
        severity_number: severity as i32,
        severity_text: severity_text.to_owned(),
        event_name: "countersign.confirm".to_owned(),
        body: text(kind),
        attributes,
        ..Default::default()
    }
}

/// The request that carries `events` from `collector`'s service and instance.
pub fn request(
    collector: &Collector,
    events: &[Recorded],
    now_ms: u64,
) -> ExportLogsServiceRequest {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![
                    attribute("service.name", text(collector.service.as_str())),
                    attribute("service.instance.id", text(collector.instance.as_str())),
                    attribute("service.version", text(env!("CARGO_PKG_VERSION"))),
                ],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs {
                scope: Some(InstrumentationScope {
                    name: "countersign".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                log_records: events.iter().map(|e| log_record(e, now_ms)).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// Why a batch was not acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The collector could not be reached, or did not answer in time.
    #[error("the collector at {endpoint} cannot be reached: {reason}")]
    Unreachable {
        /// The endpoint, as shown.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// The collector answered with an error status.
    #[error("the collector at {endpoint} answered {status}")]
    Refused {
        /// The endpoint, as shown.
        endpoint: String,
        /// The HTTP status.
        status: u16,
    },
}

/// Why a round of a [`Sender`] sent nothing: said in the log, and the round is tried again.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    /// The records could not be read (the sink's claim, or the events after its cursor).
    #[error("the records cannot be read: {0}")]
    Read(#[source] countersign_store::StoreError),
    /// The collector did not acknowledge the batch.
    #[error(transparent)]
    Send(SendError),
    /// The records could not be written (the sink's cursor).
    #[error("the records cannot be written: {0}")]
    Write(#[source] countersign_store::StoreError),
}

/// Sends the history's events to a collector, from the sink's cursor on, until stopped.
pub struct Sender {
    records: Arc<dyn Records>,
    collector: Collector,
    holder: String,
    clock: Arc<dyn Clock>,
    client: reqwest::Client,
    /// The cursor and until when this sender holds the sink, as its last claim said: an idle
    /// round then only reads (a claim is a write, durably committed), and the claim is renewed
    /// once half the lease has gone.
    held: std::sync::Mutex<Option<(u64, u64)>>,
}

impl Sender {
    /// A sender of `records`' history to `collector`, as `holder` (this process, unique among
    /// the replicas sharing the records), reading the time from `clock`.
    pub fn new(
        records: Arc<dyn Records>,
        collector: Collector,
        holder: impl Into<String>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let client = reqwest::Client::builder()
            .timeout(POST_TIMEOUT)
            .build()
            .unwrap_or_default();
        Sender {
            records,
            collector,
            holder: holder.into(),
            clock,
            client,
            held: std::sync::Mutex::new(None),
        }
    }

    /// Posts `events`; `Ok` once the collector acknowledged them (any 2xx).
    pub async fn post(&self, events: &[Recorded]) -> Result<(), SendError> {
        let body = request(&self.collector, events, self.clock.now_ms()).encode_to_vec();
        let endpoint = self.collector.endpoint_text();
        let answer = self
            .client
            .post(self.collector.endpoint.clone())
            .headers(self.collector.headers.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
            .body(body)
            .send()
            .await
            .map_err(|e| SendError::Unreachable {
                endpoint: endpoint.clone(),
                // Without the URL: it was given already, and could carry a credential.
                reason: e.without_url().to_string(),
            })?;
        let status = answer.status();
        if !status.is_success() {
            return Err(SendError::Refused {
                endpoint,
                status: status.as_u16(),
            });
        }
        // A collector may take the request and still reject some records for good: retrying
        // would not change that, so it is said, and the cursor moves on. Only so much of its
        // answer is read: an endless one must not fill the memory of the authority.
        if let Some(bytes) = first_bytes(answer, MAX_ANSWER).await
            && let Ok(response) = ExportLogsServiceResponse::decode(bytes.as_slice())
            && let Some(partial) = response.partial_success
            && partial.rejected_log_records > 0
        {
            tracing::warn!(
                target: "confirm",
                rejected = partial.rejected_log_records,
                message = %partial.error_message,
                "the collector rejected some events for good"
            );
        }
        Ok(())
    }

    /// Sends until `stop` is cancelled: every event after the cursor, oldest first, each batch
    /// again until the collector acknowledges it.
    pub async fn run(self, stop: CancellationToken) {
        let endpoint = self.collector.endpoint_text();
        tracing::info!(target: "confirm", endpoint = %endpoint, "sending confirm events to an OpenTelemetry collector");
        let mut pause = MIN_PAUSE;
        let mut failing = false;
        loop {
            let wait = match self.once().await {
                Ok(true) => {
                    if failing {
                        tracing::info!(target: "confirm", endpoint = %endpoint, "the collector takes events again");
                        failing = false;
                    }
                    pause = MIN_PAUSE;
                    continue;
                }
                Ok(false) => IDLE,
                Err(reason) => {
                    if !failing {
                        tracing::warn!(target: "confirm", error = %reason, "events wait for the collector");
                        failing = true;
                    }
                    let now = pause;
                    pause = (pause * 2).min(MAX_PAUSE);
                    now
                }
            };
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One round: `Ok(true)` when a batch was acknowledged (look again at once), `Ok(false)`
    /// when there was nothing to send or another sender holds the sink.
    async fn once(&self) -> Result<bool, RoundError> {
        let now = self.clock.now_ms();
        let cursor = match self.still_held(now) {
            Some(cursor) => cursor,
            None => match self
                .records
                .export_claim(SINK, &self.holder, now, LEASE_MS)
                .await
            {
                Ok(Some(cursor)) => {
                    self.hold(Some((cursor, now.saturating_add(LEASE_MS))));
                    cursor
                }
                Ok(None) => {
                    self.hold(None);
                    return Ok(false);
                }
                Err(e) => return Err(RoundError::Read(e)),
            },
        };
        let events = self
            .records
            .recorded_after(cursor, BATCH)
            .await
            .map_err(RoundError::Read)?;
        let Some(last) = events.last().and_then(|e| e.chained).map(|c| c.seq) else {
            return Ok(false);
        };
        if let Err(e) = self.post(&events).await {
            let reason = e.to_string();
            if let Err(store) = self.records.export_failed(SINK, now, &reason).await {
                tracing::warn!(target: "confirm", error = %store, "could not note the collector's failure");
            }
            return Err(RoundError::Send(e));
        }
        match self
            .records
            .export_advance(SINK, &self.holder, cursor, last)
            .await
        {
            Ok(true) => {
                self.hold(self.held_now().map(|(_, until)| (last, until)));
                Ok(true)
            }
            // Another sender took the sink meanwhile (this one was away past its lease): claim
            // again before sending more.
            Ok(false) => {
                self.hold(None);
                Ok(true)
            }
            Err(e) => Err(RoundError::Write(e)),
        }
    }

    /// The cursor, while the last claim holds for more than half a lease.
    fn still_held(&self, now: u64) -> Option<u64> {
        self.held_now()
            .filter(|(_, until)| until.saturating_sub(now) > LEASE_MS / 2)
            .map(|(cursor, _)| cursor)
    }

    fn held_now(&self) -> Option<(u64, u64)> {
        *lock(&self.held)
    }

    fn hold(&self, held: Option<(u64, u64)>) {
        *lock(&self.held) = held;
    }
}

#[cfg(test)]
mod tests {
    use countersign_core::telemetry::ConfirmEvent;
    use countersign_core::{Nonce, PlanHash, Refusal};

    use super::*;

    fn collector() -> Collector {
        Collector::new("http://127.0.0.1:4318/v1/logs", "countersign-desk", "i1").unwrap()
    }

    #[test]
    fn an_event_becomes_a_record_with_its_chain_place_and_no_more() {
        let recorded = Recorded {
            event: ConfirmEvent {
                at_ms: 1_700,
                kind: EventKind::Refused {
                    refusal: Refusal::Expired,
                },
                tool: "execute".into(),
                target: Some("users".into()),
                tenant: "c1".into(),
                nonce: Some(Nonce::from_bytes([1; 16])),
                plan: Some(PlanHash::from_bytes([2; 32])),
                note: None,
            },
            chained: None,
        };
        let record = log_record(&recorded, 2_000);
        assert_eq!(record.time_unix_nano, 1_700_000_000);
        assert_eq!(record.observed_time_unix_nano, 2_000_000_000);
        assert_eq!(record.severity_number, SeverityNumber::Warn as i32);
        let keys: Vec<&str> = record.attributes.iter().map(|a| a.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "countersign.event",
                "countersign.tool",
                "countersign.tenant",
                "countersign.code",
                "countersign.target",
                "countersign.plan_hash",
                "countersign.nonce",
            ]
        );
    }

    #[test]
    fn the_standard_variables_name_the_collector_and_its_headers_stay_unprinted() {
        let vars = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("https://otel.example:4318/".to_owned()),
            "OTEL_EXPORTER_OTLP_HEADERS" => Some("api-key=s3cr%3Dt,x-team=blue".to_owned()),
            _ => None,
        };
        let c = Collector::from_env(vars, "countersign-serve", "r1")
            .unwrap()
            .unwrap();
        assert_eq!(c.endpoint_text(), "https://otel.example:4318/v1/logs");
        assert_eq!(c.headers["api-key"], "s3cr=t");
        assert!(!format!("{c:?}").contains("s3cr"));
        let full = |name: &str| {
            (name == "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT").then(|| "http://h:1/custom".to_owned())
        };
        let c = Collector::from_env(full, "s", "i").unwrap().unwrap();
        assert_eq!(c.endpoint_text(), "http://h:1/custom");
        assert!(Collector::from_env(|_| None, "s", "i").unwrap().is_none());
        for bad in ["ftp://h/x", "not a url", "http://"] {
            assert!(Collector::new(bad, "s", "i").is_err(), "{bad}");
        }
        assert_eq!(
            collector().with_headers("novalue").unwrap_err(),
            CollectorError::BadHeader(1)
        );
    }

    #[test]
    fn an_endpoint_is_shown_without_its_credentials() {
        let c = Collector::new("https://user:pw@otel.example/v1/logs?token=t", "s", "i").unwrap();
        assert_eq!(c.endpoint_text(), "https://otel.example/v1/logs");
    }
}
