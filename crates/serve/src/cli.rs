//! The command line of `countersign serve`.
//!
//! The secret, the control database and the token lifetime are read from the environment by
//! [`crate::start`], never through clap's `env` support: clap shows an `env` value in `--help`
//! and in its errors, and the secret must appear nowhere.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

/// `countersign serve`: the authority for a team's agents, over MCP's streamable HTTP.
///
/// A writable server needs CONFIRM_SECRET (32 or more bytes, or --secret-file) and CONTROL_DSN
/// (the PostgreSQL control database) in its environment; CONFIRM_TTL_MS sets how long a token
/// lives (default 600000). `--read-only` serves only the tools that change nothing, and needs
/// neither.
///
/// Agents' keys, for teams without an identity provider: `countersign serve agent add NAME`,
/// `agent revoke NAME`, `agent list` (see `countersign serve agent --help`). People who approve
/// from their desks: `countersign serve approver add NAME PUBKEY`, `approver revoke NAME`,
/// `approver list`. What happened: `countersign serve history [--json] [--decisions]`.
#[derive(Debug, Clone, Parser)]
#[command(name = "countersign serve", version)]
pub struct Args {
    /// Where to listen, as HOST:PORT.
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,

    /// Serve only the tools that change nothing: no secret or control database needed.
    #[arg(long)]
    pub read_only: bool,

    /// Read the signing secret from this file (its bytes; one final newline is dropped)
    /// instead of CONFIRM_SECRET.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,

    /// The server's TLS certificate chain (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The TLS certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Serve plain HTTP: a TLS-terminating proxy in front does TLS (or the address is loopback).
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    pub behind_tls_proxy: bool,

    /// A Host the server answers to (repeatable; `name` or `name:port`). Loopback names are
    /// allowed by default when listening on loopback; any other address needs at least one.
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,

    /// An Origin a browser-borne request may come from (repeatable; `scheme://host[:port]`).
    /// A request with any other Origin is refused; one without an Origin is not a browser's.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,

    /// The OAuth authorization server whose access tokens this server accepts (its `iss`).
    #[arg(long, value_name = "URL", requires = "resource")]
    pub issuer: Option<String>,

    /// This server's canonical URI (e.g. https://mcp.example.com/mcp): the audience a token must
    /// name (RFC 8707), and where its metadata says it is.
    #[arg(long, value_name = "URL", requires = "issuer")]
    pub resource: Option<String>,

    /// Where the issuer publishes its signing keys (JWKS, HTTPS).
    #[arg(
        long,
        value_name = "URL",
        requires = "issuer",
        conflicts_with = "jwt_key_file"
    )]
    pub jwks_url: Option<String>,

    /// The issuer's public key as a PEM file, for sites without a route to the issuer.
    #[arg(long, value_name = "FILE", requires = "issuer")]
    pub jwt_key_file: Option<PathBuf>,

    /// The scope an access token must carry.
    #[arg(long, value_name = "SCOPE", requires = "issuer")]
    pub scope: Option<String>,

    /// Accept the agent keys this server issued (`countersign serve agent add NAME`) as bearer
    /// tokens. Outside the MCP authorization spec: for teams without an identity provider.
    #[arg(long)]
    pub agent_keys: bool,

    /// Authenticate nobody: every request is the one caller `unauthenticated`. Loopback only.
    #[arg(long, conflicts_with_all = ["issuer", "agent_keys"])]
    pub unauthenticated: bool,

    /// Where a read-only server without CONTROL_DSN keeps its records (SQLite). Without it, a
    /// temporary directory that goes with the process.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// How long a gated call's preflight waits for a person before it is answered `pending`, in
    /// seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 25)]
    pub wait: u64,

    /// Send every confirm event to this OpenTelemetry collector (its OTLP/HTTP logs endpoint,
    /// such as `https://otel.example:4318/v1/logs`). Without it, the standard
    /// `OTEL_EXPORTER_OTLP_LOGS_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` (and `…_HEADERS`) are
    /// read. Events wait in the records until the collector acknowledges them.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// The team's upstreams, from a servers file (the desk's `servers.json` format): each is
    /// served at `/mcp/<name>`.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["db", "url", "command"])]
    pub servers: Option<PathBuf>,

    /// Where the servers file's secret values are, as files `DIR/<server>/<key>` (else the
    /// environment's `COUNTERSIGN_SECRET_<SERVER>_<KEY>`).
    #[arg(long, value_name = "DIR", requires = "servers")]
    pub secrets_dir: Option<PathBuf>,

    /// The policy (the desk's `policy.toml` format): classes, targets and approvals per server and
    /// tool. Without it, tools are classed by their annotations.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,

    /// Rules over arguments, in Cedar (the desk's `policy.cedar` format): forbid calls, open
    /// them, or ask more of them by what they carry. Refused at start when it does not parse;
    /// checked against the upstreams' tools as they list them (a rule naming a tool no upstream
    /// lists waits for it, and refuses the listed tools it names meanwhile).
    #[arg(long, value_name = "FILE")]
    pub rules: Option<PathBuf>,

    /// How many distinct approvers must approve a change of the rules (1 to 9): an edit of the
    /// --rules file after the first start waits for them, shown with what it widens, and the
    /// rules in force stay the ones last approved until then.
    #[arg(long, value_name = "M", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=9))]
    pub rules_approvers: u8,

    /// Where people's desks connect to approve (HOST:PORT): mutual TLS only, each desk by the
    /// key it was registered with (`countersign serve approver add`); never an agent's token.
    #[arg(long, value_name = "ADDR", requires = "approver_url")]
    pub approver_listen: Option<SocketAddr>,

    /// This server's name in every decision: the approver listener's URL as desks enroll with
    /// it (`countersign approver enroll URL`), so a decision made for another server is worth
    /// nothing here. Needed with --approver-listen or --approver-web.
    #[arg(long, value_name = "URL")]
    pub approver_url: Option<String>,

    /// Where people approve from a browser with a passkey (HOST:PORT): the approvers' page.
    /// TLS in-process with --approver-web-cert/--approver-web-key (or --tls-cert/--tls-key), or
    /// plain HTTP behind the TLS-terminating proxy that serves --approver-web-origin.
    #[arg(long, value_name = "ADDR", requires_all = ["approver_url", "approver_web_origin"])]
    pub approver_web: Option<SocketAddr>,

    /// The approvers' page's origin as browsers see it (`https://approve.example.com`, or
    /// `http://localhost:PORT` to try it on one machine): passkeys are bound to its host.
    #[arg(long, value_name = "URL", requires = "approver_web")]
    pub approver_web_origin: Option<String>,

    /// The approvers' page's certificate chain (PEM); without it, --tls-cert's, or plain HTTP
    /// behind a TLS proxy.
    #[arg(long, value_name = "FILE", requires_all = ["approver_web_key", "approver_web"])]
    pub approver_web_cert: Option<PathBuf>,

    /// The approvers' page certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires_all = ["approver_web_cert", "approver_web"])]
    pub approver_web_key: Option<PathBuf>,

    /// The approver listener's certificate chain (PEM); without it, --tls-cert's.
    #[arg(long, value_name = "FILE", requires_all = ["approver_key", "approver_listen"])]
    pub approver_cert: Option<PathBuf>,

    /// The approver listener certificate's private key (PEM); without it, --tls-key's.
    #[arg(long, value_name = "FILE", requires_all = ["approver_cert", "approver_listen"])]
    pub approver_key: Option<PathBuf>,

    /// Where operators read the server (HOST:PORT, plain HTTP): `GET /metrics` (Prometheus),
    /// `/healthz` and `/readyz`. A port of its own; it takes no credentials and serves nothing
    /// an agent could act on.
    #[arg(long, value_name = "ADDR")]
    pub operator_listen: Option<SocketAddr>,

    /// Post a JSON notice to this URL on each new waiting call (repeatable; https://, or
    /// http:// to loopback). It names who asks, the tool, the target and the server; never the
    /// arguments or a token.
    #[arg(long = "webhook", value_name = "URL", requires = "approver_url")]
    pub webhooks: Vec<String>,

    /// As --webhook, in the shape of a Slack incoming webhook (`{"text": …}`).
    #[arg(long = "slack-webhook", value_name = "URL", requires = "approver_url")]
    pub slack_webhooks: Vec<String>,

    /// As --webhook, as a Microsoft Teams workflow's incoming webhook (an Adaptive Card with a
    /// link to the call when there is an approvers' page).
    #[arg(long = "teams-webhook", value_name = "URL", requires = "approver_url")]
    pub teams_webhooks: Vec<String>,

    /// Trigger a PagerDuty incident (Events API v2) on each new waiting call, with the routing
    /// key of the integration read from FILE (a secret: it is never logged).
    #[arg(long, value_name = "FILE", requires = "approver_url")]
    pub pagerduty_routing_key_file: Option<PathBuf>,

    /// PagerDuty's Events API URL (https://, or http:// to loopback).
    #[arg(long, value_name = "URL", requires = "pagerduty_routing_key_file")]
    pub pagerduty_url: Option<String>,

    /// The upstream: the built-in SQLite tools on this database file.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["url", "command"])]
    pub db: Option<PathBuf>,

    /// The upstream: a streamable-HTTP MCP server.
    #[arg(long, value_name = "URL", conflicts_with = "command")]
    pub url: Option<String>,

    /// The upstream: a stdio MCP server, started by the server as its child (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `countersign serve agent`: the keys this server issues to agents without an identity
/// provider. The records are the server's: CONTROL_DSN, or `--data-dir` for a read-only server
/// that keeps them in SQLite.
#[derive(Debug, Clone, Parser)]
#[command(name = "countersign serve agent", version)]
pub struct AgentArgs {
    /// The records' directory of a server without CONTROL_DSN.
    #[arg(long, value_name = "DIR", global = true)]
    pub data_dir: Option<PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub action: AgentAction,
}

/// What `countersign serve agent` does.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum AgentAction {
    /// Make a key for agent NAME and print it, once: the server keeps only its hash.
    Add {
        /// The agent's name (letters, digits, '.', '_', '-'); its tenant is `key:NAME`.
        name: String,
    },
    /// Revoke agent NAME's key: its next request is refused.
    Revoke {
        /// The agent's name.
        name: String,
    },
    /// List the agents, and which are revoked.
    List,
}

/// `countersign serve approver`: the people who approve this server's calls from their desks,
/// each known by the Ed25519 public key its desk made (`countersign approver enroll URL` prints
/// the line to run here). The records are the server's, as for `agent`.
#[derive(Debug, Clone, Parser)]
#[command(name = "countersign serve approver", version)]
pub struct ApproverArgs {
    /// The records' directory of a server without CONTROL_DSN.
    #[arg(long, value_name = "DIR", global = true)]
    pub data_dir: Option<PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub action: ApproverAction,
}

/// What `countersign serve approver` does.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ApproverAction {
    /// Register approver NAME by the public key its desk printed (`ed25519:…`).
    Add {
        /// The approver's name (letters, digits, '.', '_', '-'), as decisions record it.
        name: String,
        /// The desk's public key, as `countersign approver enroll` printed it.
        public_key: String,
    },
    /// Print a one-time link that enrolls a passkey for approver NAME on the approvers' page
    /// (works once, for 15 minutes; the server keeps only its hash). NAME may already have a
    /// desk key or passkeys: they are one person, counted once.
    Invite {
        /// The approver's name (letters, digits, '.', '_', '-'), as decisions record it.
        name: String,
        /// The approvers' page's origin (the server's --approver-web-origin).
        #[arg(long, value_name = "URL")]
        page: String,
    },
    /// Revoke approver NAME: its desk can no longer connect, its passkeys no longer sign in or
    /// decide, and its approvals stop counting toward calls that still wait.
    Revoke {
        /// The approver's name.
        name: String,
    },
    /// List the approvers (desk keys and passkeys), and which are revoked.
    List,
    /// Print the roster as JSON (desk keys and passkeys' public credentials, revoked ones
    /// included): what `countersign serve verify-decisions` checks kept decisions against.
    Export,
}

/// `countersign serve verify-decisions`: checks kept decisions (`countersign serve history
/// --decisions --json` lines) offline, against an exported roster (`countersign serve approver
/// export`): each line says whether this person's desk key or passkey signed exactly this
/// decision. Exit 0 when every one checks, 1 when any does not, 2 for unusable input.
#[derive(Debug, Clone, Parser)]
#[command(name = "countersign serve verify-decisions", version)]
pub struct VerifyArgs {
    /// The exported roster (JSON).
    #[arg(long, value_name = "FILE")]
    pub roster: PathBuf,
    /// The approvers' page's origin its passkeys are bound to (the server's
    /// --approver-web-origin); needed for decisions a passkey signed.
    #[arg(long, value_name = "URL")]
    pub origin: Option<String>,
    /// The decisions, one JSON object per line; standard input when absent.
    #[arg(value_name = "FILE")]
    pub decisions: Option<PathBuf>,
}

/// `countersign serve history`: the server's history of approvals, confirms and refusals, newest
/// first, from its records (CONTROL_DSN, or `--data-dir`); or, with `--decisions`, the approvers'
/// signed decisions.
#[derive(Debug, Clone, Parser)]
#[command(name = "countersign serve history", version)]
pub struct HistoryArgs {
    /// The records' directory of a server without CONTROL_DSN.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Only this tool.
    #[arg(long, value_name = "TOOL", conflicts_with = "decisions")]
    pub tool: Option<String>,

    /// At most this many.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: usize,

    /// The approvers' signed decisions (with each approver's key, to check the signatures).
    #[arg(long)]
    pub decisions: bool,

    /// Check the history's signed chain instead: names the first event that was edited,
    /// deleted, reordered or cut off, or a forged head. Exit 0 intact, 1 broken.
    #[arg(long, conflicts_with_all = ["decisions", "json", "tool"])]
    pub verify: bool,

    /// With --verify: the server's public chain key (`ed25519:…`; a writable server logs it
    /// at start, derived from its CONFIRM_SECRET). Without it, the key the history names is used.
    #[arg(long, value_name = "KEY", requires = "verify")]
    pub key: Option<String>,

    /// With --verify: a head kept from before (a `{"head": …}` line); the history must still
    /// hold the event it signed. May be given more than once.
    #[arg(long, value_name = "FILE", requires = "verify")]
    pub head: Vec<PathBuf>,

    /// With --verify: an event seen elsewhere, `SEQ:HASH` (the collector's `countersign.seq` and
    /// `countersign.chain.hash`); the history must still hold it. May be given more than once.
    #[arg(long, value_name = "SEQ:HASH", requires = "verify")]
    pub seen: Vec<String>,
}
