//! The operator listener (`--operator-listen ADDR`): what the people who run the server read,
//! never what agents or approvers use.
//!
//! | route | answers |
//! | --- | --- |
//! | `GET /metrics` | [`crate::metrics`], in the Prometheus text format |
//! | `GET /healthz` | `200` while the process serves at all |
//! | `GET /readyz` | `200` when the records (the control database) answer a read, else `503` |
//!
//! Its own port, never the agents' or the approvers': nothing here is routed on those, and
//! nothing of those is routed here. It is plain HTTP, because what it serves is counts (labels
//! from fixed sets, no tool, target, tenant, token or argument) and two yes-or-no answers, and a
//! Prometheus scrapes plain HTTP unless told otherwise; bind it to loopback or to a network only
//! the scraper reaches. It takes no credentials at all: a request that carries an
//! `Authorization` header is refused before it is read further, so an agent's token sent here by
//! mistake is never looked at, and nothing here would let anyone act (no call, no approval, no
//! queue). A browser's request (it carries `Origin`) is refused, and a Host must be an IP
//! literal, a loopback name or one of `--allowed-host`: a web page that points a name it
//! controls at the listener (DNS rebinding) cannot read it. Its connections get the same limits
//! and slow-client cut as the agents' listener, and the same drain on stop.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use countersign_engine::Engine;
use countersign_store::{HistoryFilter, Records};

use crate::guard::Guard;
use crate::http::refuse;
use crate::metrics::{self, Metrics};

/// How long `/readyz` waits for the records to answer.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// What the operator listener reads.
pub struct Operator {
    /// The server's metrics.
    pub metrics: Metrics,
    /// The engine, for the queue's length.
    pub engine: Engine,
    /// The records, for readiness.
    pub records: Arc<dyn Records>,
    /// The Host names (beyond IP literals) the listener answers to.
    pub guard: Guard,
}

/// The operator listener's routes, behind its guard.
pub fn router(operator: Arc<Operator>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            operator.clone(),
            layer,
        ))
        .with_state(operator)
}

async fn scrape(State(operator): State<Arc<Operator>>) -> Response {
    let text = operator.metrics.render(&operator.engine);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(metrics::CONTENT_TYPE),
        )],
        text,
    )
        .into_response()
}

async fn healthz() -> Response {
    (StatusCode::OK, "ok\n").into_response()
}

async fn readyz(State(operator): State<Arc<Operator>>) -> Response {
    let filter = HistoryFilter {
        limit: Some(1),
        ..HistoryFilter::default()
    };
    match tokio::time::timeout(READY_TIMEOUT, operator.records.history(&filter)).await {
        Ok(Ok(_)) => (StatusCode::OK, "ready\n").into_response(),
        // The error is not shown: it may name the database's host.
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the records do not answer\n",
        )
            .into_response(),
    }
}

async fn not_found() -> Response {
    refuse(
        StatusCode::NOT_FOUND,
        "not_found",
        "the operator listener serves GET /metrics, /healthz and /readyz",
    )
}

/// Whether `host` is an IP literal (`1.2.3.4`, `1.2.3.4:9`, `[::1]`, `[::1]:9`): no name a web
/// page could point elsewhere.
fn ip_literal(host: &str) -> bool {
    let host = host.trim();
    host.parse::<std::net::IpAddr>().is_ok()
        || host.parse::<std::net::SocketAddr>().is_ok()
        || host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok())
}

/// Refuses credentials, browsers and Hosts it does not answer to, before any route runs.
async fn layer(State(operator): State<Arc<Operator>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    if headers.contains_key(header::AUTHORIZATION) {
        return refuse(
            StatusCode::FORBIDDEN,
            "no_credentials_here",
            "the operator listener takes no credentials and serves nothing to act on: send none",
        );
    }
    if headers.contains_key(header::ORIGIN) {
        return refuse(
            StatusCode::FORBIDDEN,
            "origin_not_allowed",
            "the operator listener is not for browsers",
        );
    }
    let authority = request.uri().authority().map(|a| a.as_str().to_owned());
    let hosts: Vec<&str> = headers
        .get_all(header::HOST)
        .iter()
        .filter_map(|h| h.to_str().ok())
        .collect();
    let by_ip = match (&hosts[..], authority.as_deref()) {
        ([one], None) => ip_literal(one),
        ([one], Some(authority)) => one.eq_ignore_ascii_case(authority) && ip_literal(one),
        ([], Some(authority)) => ip_literal(authority),
        _ => false,
    };
    if !by_ip
        && operator
            .guard
            .refuse(authority.as_deref(), headers)
            .is_some()
    {
        return refuse(
            StatusCode::FORBIDDEN,
            "host_not_allowed",
            "the operator listener answers to IP literals, loopback names and --allowed-host",
        );
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ip_literals_pass_without_being_listed() {
        for ok in ["127.0.0.1", "10.0.0.5:9464", "[::1]", "[::1]:9464", "::1"] {
            assert!(ip_literal(ok), "{ok}");
        }
        for no in [
            "localhost",
            "evil.example",
            "127.0.0.1.evil.example",
            "[::1",
            "",
        ] {
            assert!(!ip_literal(no), "{no}");
        }
    }
}
