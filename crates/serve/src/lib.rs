//! `countersign serve`: the desk's authority where one machine is not enough.
//!
//! Teams run agents on CI runners and hosted machines where no desk sits. This crate serves the
//! same engine (default-deny router, classes, policy, pins, previews, grants) to those agents
//! over MCP's streamable HTTP, stateless, with its records in PostgreSQL so that several replicas
//! share one nonce ledger. It is a program of its own (`countersign-serve`, reached as
//! `countersign serve`), so the pipe agents start on a desktop keeps its size and start time.
//!
//! The rooms:
//!
//! | module | why |
//! | --- | --- |
//! | [`approvers`] | where people's desks connect (mutual TLS, pinned keys) and send signed decisions |
//! | [`auth`] | who is calling: OAuth bearer JWTs (the MCP authorization spec), the tenant |
//! | [`cli`] | the command line |
//! | [`start`] | the seed's start rules, decided before anything is opened or bound |
//! | [`guard`] | which Host and Origin may reach the server at all |
//! | [`notify`] | webhooks on each new waiting call (generic JSON, Slack) |
//! | [`http`] | the one MCP endpoint: each POST answered on its own, through the router |
//! | [`metrics`] | what the server counts, for Prometheus |
//! | [`operator`] | the operator listener: `/metrics`, `/healthz`, `/readyz` |
//! | [`rules`] | the rules over arguments on record, the same on every replica; edits proposed to the approvers |
//! | [`tls`] | TLS in-process, or plain HTTP behind a TLS-terminating proxy |
//! | [`run`] | opening the records, starting the upstream, binding, serving |

pub mod approvers;
pub mod auth;
pub mod cli;
pub mod guard;
pub mod http;
pub mod kept;
pub mod metrics;
pub mod notify;
pub mod operator;
pub mod rules;
pub mod run;
pub mod servers;
pub mod start;
pub mod tls;
pub mod web;
