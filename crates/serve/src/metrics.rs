//! What the server counts, for Prometheus: the registry behind the operator listener's
//! `GET /metrics` ([`crate::operator`]).
//!
//! The library is `prometheus-client`, the Prometheus project's own Rust client: a registry is a
//! value (no global default registry to register into by accident, unlike the older
//! `prometheus` crate or the `metrics` facade's global recorder), its label sets are typed, and
//! it writes the Prometheus text format (0.0.4) that every Prometheus scrapes. It needs nothing
//! beyond the standard library and a lock crate.
//!
//! Nothing is counted here by guessing: the engine decides every call and tallies what it
//! decided ([`countersign_engine::tally`]); [`Metrics::tally`] hands the engine the function that
//! turns each tally into an increment or an observation. The registry is [`Metrics`]'s, owned by
//! the running server, and handed to nothing else.
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `countersign_requests_total` | counter | `class` (`open`, `token`, `once`, `none`), `outcome` |
//! | `countersign_refusals_total` | counter | `code` (a refusal's or a rejection's code) |
//! | `countersign_waiting_calls` | gauge | none: calls waiting for a person on this replica |
//! | `countersign_decision_seconds` | histogram | `decision` (`approved`, `denied`) |
//! | `countersign_ledger_spend_seconds` | histogram | `result` (`spent`, `already_spent`, `unreachable`) |
//!
//! Every label value comes from a fixed set the code names: never a tool, a target, a tenant, a
//! server's name or anything else an agent chooses, so the number of series is bounded and no
//! label carries what an agent wrote. No metric carries a token, a secret or an argument.

use countersign_engine::{Engine, Outcome, Spend, Tallied, Tally};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The `Content-Type` of what [`Metrics::render`] writes.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A call's class, as a label: the tool's class on its connection, or `none` for a tool it does
/// not offer.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Request {
    class: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Refusal {
    code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Decision {
    decision: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LedgerSpend {
    result: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// A person's time to decide: from a second to an hour.
fn decision_histogram() -> Histogram {
    Histogram::new([
        1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    ])
}

/// A spend against the records: half a millisecond to about four seconds.
fn ledger_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

/// The metric handles the engine's tallies go to (each a shared handle: clones count together).
#[derive(Clone)]
struct Counts {
    requests: Family<Request, Counter>,
    refusals: Family<Refusal, Counter>,
    decisions: Histograms<Decision>,
    spends: Histograms<LedgerSpend>,
}

impl Counts {
    fn count(&self, tallied: Tallied) {
        match tallied {
            Tallied::Request { class, outcome } => {
                let class = class.map_or("none", |c| c.code());
                self.requests
                    .get_or_create(&Request {
                        class,
                        outcome: outcome.code(),
                    })
                    .inc();
            }
            Tallied::Refusal { code } => {
                self.refusals.get_or_create(&Refusal { code }).inc();
            }
            Tallied::Decided { approved, waited } => {
                let decision = if approved { "approved" } else { "denied" };
                self.decisions
                    .get_or_create(&Decision { decision })
                    .observe(waited.as_secs_f64());
            }
            Tallied::Spent { spend, took } => {
                self.spends
                    .get_or_create(&LedgerSpend {
                        result: spend.code(),
                    })
                    .observe(took.as_secs_f64());
            }
            // A tally this server does not know yet is not counted under a guessed name.
            _ => {}
        }
    }
}

/// The server's metrics: the registry and what records into it.
pub struct Metrics {
    registry: Registry,
    counts: Counts,
    waiting: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric of the table above, each series of a request's class and
    /// outcome present from the start (at 0), so a dashboard's rate is defined before the first
    /// call.
    pub fn new() -> Self {
        let counts = Counts {
            requests: Family::default(),
            refusals: Family::default(),
            decisions: Family::new_with_constructor(decision_histogram),
            spends: Family::new_with_constructor(ledger_histogram),
        };
        for class in ["open", "token", "once", "none"] {
            for outcome in Outcome::ALL {
                let _ = counts.requests.get_or_create(&Request {
                    class,
                    outcome: outcome.code(),
                });
            }
        }
        for decision in ["approved", "denied"] {
            let _ = counts.decisions.get_or_create(&Decision { decision });
        }
        for spend in [Spend::Spent, Spend::AlreadySpent, Spend::Unreachable] {
            let _ = counts.spends.get_or_create(&LedgerSpend {
                result: spend.code(),
            });
        }
        let waiting = Gauge::default();
        let mut registry = Registry::with_prefix("countersign");
        registry.register(
            "requests",
            "Agents' tool calls by the tool's class and what became of them: an open call \
             forwarded; a preflight approved, denied, pending or refused; a confirm refused, \
             replayed, or executed (ok, error, outcome unknown)",
            counts.requests.clone(),
        );
        registry.register(
            "refusals",
            "Refusals agents received, by code",
            counts.refusals.clone(),
        );
        registry.register(
            "waiting_calls",
            "Calls waiting for a person on this replica",
            waiting.clone(),
        );
        registry.register_with_unit(
            "decision",
            "Time from a call queued to a person's approve or deny, on this replica",
            Unit::Seconds,
            counts.decisions.clone(),
        );
        registry.register_with_unit(
            "ledger_spend",
            "Time the records took to spend a works-once token's nonce",
            Unit::Seconds,
            counts.spends.clone(),
        );
        Metrics {
            registry,
            counts,
            waiting,
        }
    }

    /// What the engine counts into ([`countersign_engine::EngineConfig::tally`]).
    pub fn tally(&self) -> Tally {
        let counts = self.counts.clone();
        Tally::new(move |tallied| counts.count(tallied))
    }

    /// The metrics now, in the Prometheus text format: the queue's length read from `engine`
    /// first.
    pub fn render(&self, engine: &Engine) -> String {
        let waiting = engine
            .pending()
            .iter()
            .filter(|r| r.call().is_some())
            .count();
        self.waiting.set(i64::try_from(waiting).unwrap_or(i64::MAX));
        let mut text = String::new();
        // Writing to a String cannot fail; were it ever to, the scrape shows what was written.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use countersign_core::GateClass;

    use super::*;

    fn rendered(metrics: &Metrics) -> String {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &metrics.registry).unwrap();
        text
    }

    #[test]
    fn tallies_become_series_whose_labels_come_from_fixed_sets() {
        let metrics = Metrics::new();
        let count = |t| metrics.counts.count(t);
        count(Tallied::Request {
            class: Some(GateClass::Once),
            outcome: Outcome::ExecutedOk,
        });
        count(Tallied::Request {
            class: None,
            outcome: Outcome::Refused,
        });
        count(Tallied::Refusal {
            code: "already_used",
        });
        count(Tallied::Decided {
            approved: true,
            waited: Duration::from_secs(3),
        });
        count(Tallied::Spent {
            spend: Spend::Spent,
            took: Duration::from_millis(2),
        });
        let text = rendered(&metrics);
        for line in [
            "countersign_requests_total{class=\"once\",outcome=\"executed_ok\"} 1",
            "countersign_requests_total{class=\"none\",outcome=\"refused\"} 1",
            "countersign_requests_total{class=\"open\",outcome=\"forwarded\"} 0",
            "countersign_refusals_total{code=\"already_used\"} 1",
            "countersign_decision_seconds_count{decision=\"approved\"} 1",
            "countersign_decision_seconds_bucket{decision=\"approved\",le=\"5\"} 1",
            "countersign_ledger_spend_seconds_count{result=\"spent\"} 1",
            "# TYPE countersign_waiting_calls gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
