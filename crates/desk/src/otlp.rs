//! The desk's confirm events sent to the OpenTelemetry collector named in its settings.
//!
//! The sending itself is `countersign_otlp`'s: from history, by the sink's cursor, so a collector
//! that is down makes events wait (in order, across restarts) instead of losing them. This holds
//! the one sender of the desk, restarts it when the person changes the endpoint in Settings, and
//! says in the History view how many events wait and why. It reads and writes the desk's file
//! through a connection of its own (SQLite takes several): the engine's records stay the engine's.

use countersign_core::sync::lock;
use std::sync::{Arc, Mutex};

use countersign_otlp::{Collector, CollectorError, SINK, Sender};
use countersign_store::{Records, Sqlite, Store, StoreError, StoreOptions};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// What the History view shows of the collector: `None` when none is set.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ExportView {
    /// The endpoint, without credentials.
    pub endpoint: String,
    /// Events recorded and not yet acknowledged by the collector.
    pub waiting: u64,
    /// Since when sending fails, ms since the epoch.
    pub failing_since_ms: Option<u64>,
    /// The last failure.
    pub last_error: Option<String>,
}

/// The desk's sender, if a collector is set.
pub struct Export {
    records: Arc<dyn Records>,
    running: Mutex<Option<(CancellationToken, String)>>,
}

impl Export {
    /// The sender for the desk's file at `store`; nothing is sent until [`Export::apply`].
    pub fn new(store: std::path::PathBuf) -> Export {
        Export {
            records: Arc::new(Sqlite::new(Store::open_deferred(
                store,
                StoreOptions::default(),
            ))),
            running: Mutex::new(None),
        }
    }

    /// Sends to `endpoint` from now on (the sender before it stops), or, with none, stops sending
    /// and forgets the sink's cursor, so the history it held back may be pruned again.
    pub fn apply(&self, endpoint: Option<&str>) -> Result<(), CollectorError> {
        let collector = endpoint
            .map(|e| Collector::new(e, "countersign-desk", "desk"))
            .transpose()?;
        let mut running = lock(&self.running);
        if let Some((stop, _)) = running.take() {
            stop.cancel();
        }
        match collector {
            Some(collector) => {
                let stop = CancellationToken::new();
                let shown = collector.endpoint_text();
                // One holder name for the desk: a restarted desk takes its sink back at once.
                let sender = Sender::new(
                    self.records.clone(),
                    collector,
                    "desk",
                    Arc::new(countersign_engine::SystemClock),
                );
                tokio::spawn(sender.run(stop.clone()));
                *running = Some((stop, shown));
            }
            None => {
                let records = self.records.clone();
                tokio::spawn(async move {
                    if let Err(e) = records.export_forget(SINK).await {
                        tracing::warn!(target: "desk", error = %e, "could not forget the collector's cursor");
                    }
                });
            }
        }
        Ok(())
    }

    /// How the collector fares, for the History view.
    pub async fn view(&self) -> Result<Option<ExportView>, StoreError> {
        let endpoint = match &*lock(&self.running) {
            Some((_, shown)) => shown.clone(),
            None => return Ok(None),
        };
        let status = self.records.export_status(SINK).await?;
        Ok(Some(match status {
            Some(s) => ExportView {
                endpoint,
                waiting: s.waiting,
                failing_since_ms: s.failing_since_ms,
                last_error: s.last_error,
            },
            // Not claimed yet: everything waits.
            None => ExportView {
                endpoint,
                waiting: 0,
                failing_since_ms: None,
                last_error: None,
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::contract;

    #[test]
    fn the_export_view_matches_the_contract() {
        let view = ExportView {
            endpoint: "http://127.0.0.1:4318/v1/logs".into(),
            waiting: 3,
            failing_since_ms: Some(1),
            last_error: Some("down".into()),
        };
        assert_eq!(
            contract::keys(&serde_json::to_value(view).unwrap()),
            contract::expected("ExportView")
        );
    }
}
