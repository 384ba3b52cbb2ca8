//! The seed's start rules, decided before anything is opened or bound.
//!
//! A writable server refuses to start without a signing secret of 32 bytes or more
//! (`CONFIRM_SECRET`, or `--secret-file`) and without its control database (`CONTROL_DSN`): it
//! exits non-zero with a message that names what is missing, and its port is never bound. A
//! read-only server (`--read-only`: only the tools that change nothing) starts without either.
//! `CONFIRM_TTL_MS` sets the token lifetime. This module is pure: the caller reads the
//! environment and the secret file into [`Given`], and [`check`] decides.
//!
//! Nothing here ever shows a secret: errors name variables and lengths, never values, and the
//! values are held in zeroizing buffers whose `Debug` is redacted.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use countersign_core::policy::Policy;
use countersign_core::token::SigningKey;
use countersign_engine::DEFAULT_TOKEN_TTL_MS;
use countersign_wire::Reach;
use zeroize::Zeroizing;

use crate::cli::Args;
use crate::servers::Configured;

/// The shortest signing secret a writable server accepts, in bytes.
pub const MIN_SECRET_BYTES: usize = countersign_core::token::MIN_KEY_LEN;

/// The shortest token lifetime accepted, in ms: shorter cannot survive a person's click.
pub const MIN_TTL_MS: u64 = 1_000;

/// The longest token lifetime accepted, in ms (a day): an approval is for now, not for later.
pub const MAX_TTL_MS: u64 = 24 * 60 * 60 * 1_000;

/// What the environment and the secret file hold, read by the caller.
#[derive(Default)]
pub struct Given {
    /// `CONFIRM_SECRET`'s bytes, if set.
    pub confirm_secret: Option<Zeroizing<Vec<u8>>>,
    /// The `--secret-file`'s bytes, if one was named (read by the caller).
    pub secret_file: Option<Zeroizing<Vec<u8>>>,
    /// `CONFIRM_TTL_MS`, if set.
    pub confirm_ttl_ms: Option<String>,
    /// `CONTROL_DSN`, if set.
    pub control_dsn: Option<Zeroizing<String>>,
    /// The upstreams of `--servers`, loaded by the caller (secrets resolved).
    pub servers: Option<Vec<Configured>>,
    /// The policy of `--policy`, parsed by the caller.
    pub policy: Option<Policy>,
    /// The rules of `--rules`, read (and found to load) by the caller.
    pub rules: Option<String>,
    /// The OpenTelemetry collector of `--otlp-endpoint` or the `OTEL_*` variables.
    pub otlp: Option<countersign_otlp::Collector>,
}

impl fmt::Debug for Given {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Given")
            .field(
                "confirm_secret",
                &self.confirm_secret.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "secret_file",
                &self.secret_file.as_ref().map(|_| "<redacted>"),
            )
            .field("confirm_ttl_ms", &self.confirm_ttl_ms)
            .field(
                "control_dsn",
                &self.control_dsn.as_ref().map(|_| "<redacted>"),
            )
            .field("servers", &self.servers)
            .finish_non_exhaustive()
    }
}

/// The control database's connection string: it may carry a password, so it is never shown.
#[derive(Clone)]
pub struct Dsn(Zeroizing<String>);

impl Dsn {
    /// The connection string.
    pub fn new(dsn: Zeroizing<String>) -> Self {
        Dsn(dsn)
    }

    /// The string, for the one place that connects with it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Dsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Dsn(<redacted>)")
    }
}

/// Writable, or read-only.
#[derive(Debug)]
pub enum Mode {
    /// Gated tools are offered; approvals are minted with `key` and spent in the control
    /// database.
    Writable {
        /// The signing key made from the secret.
        key: SigningKey,
        /// The control database.
        dsn: Dsn,
    },
    /// Only open tools are offered.
    ReadOnly {
        /// Where history and pins go, if a control database was given.
        dsn: Option<Dsn>,
    },
}

/// How the server is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// TLS in-process, with this certificate chain and key (PEM files).
    Tls {
        /// The certificate chain.
        cert: PathBuf,
        /// The private key.
        key: PathBuf,
    },
    /// Plain HTTP: a TLS-terminating proxy in front, or loopback.
    Plain,
}

/// What the server is in front of.
#[derive(Debug)]
pub enum Upstreams {
    /// One upstream (`--db`, `--url`, `-- COMMAND`), served at `/mcp`.
    One(Reach),
    /// The servers file's, each served at `/mcp/<name>`.
    Named(Vec<Configured>),
}

/// How callers are authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authn {
    /// Nobody is: every request is one caller (loopback only).
    Unauthenticated,
    /// By bearer token: an OAuth access token, an agent key this server issued, or either.
    Bearer {
        /// OAuth, if configured.
        oauth: Option<OAuthSettings>,
        /// Whether agent keys are accepted.
        agent_keys: bool,
    },
}

/// The OAuth resource server's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthSettings {
    /// The issuer.
    pub issuer: String,
    /// This server's canonical URI.
    pub resource: String,
    /// The scope a token must carry.
    pub scope: Option<String>,
    /// Where the issuer's keys are.
    pub keys: KeySource,
}

/// Where the issuer's keys are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// Its JWKS URL.
    Jwks(String),
    /// A PEM file.
    File(PathBuf),
}

/// Everything the start rules let through: what [`crate::run`] opens, binds and serves.
#[derive(Debug)]
pub struct Start {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Writable or read-only.
    pub mode: Mode,
    /// How long a minted token lives, in ms.
    pub token_ttl_ms: u64,
    /// TLS, or plain HTTP.
    pub transport: Transport,
    /// The Hosts answered to.
    pub allowed_hosts: Vec<String>,
    /// The Origins accepted.
    pub allowed_origins: Vec<String>,
    /// How callers are authenticated.
    pub authn: Authn,
    /// The upstream(s).
    pub upstreams: Upstreams,
    /// The policy in force.
    pub policy: Policy,
    /// The rules over arguments of `--rules`, if any: in force at a first start, a proposal
    /// after (see [`crate::rules`]).
    pub rules: Option<String>,
    /// The `--rules` file, read again for edits while the server runs.
    pub rules_file: Option<PathBuf>,
    /// How many distinct approvers a change of the rules needs.
    pub rules_approvers: u8,
    /// Where a read-only server without a control database keeps its records.
    pub data_dir: Option<PathBuf>,
    /// Where confirm events are sent, if anywhere.
    pub otlp: Option<countersign_otlp::Collector>,
    /// How long a preflight waits for a person.
    pub wait_secs: u64,
    /// Whether a secret was given to a read-only server (and ignored): said once at start,
    /// without the value.
    pub secret_ignored: bool,
    /// Where people's desks connect to approve, if anywhere.
    pub approvers: Option<ApproverListen>,
    /// Where new waiting calls are announced.
    pub webhooks: Vec<crate::notify::Webhook>,
    /// Where the operator listener (metrics, health) listens, if anywhere.
    pub operator: Option<SocketAddr>,
}

/// The approver listener, as the start rules accepted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApproverListen {
    /// The URL desks enroll with; every decision names it.
    pub url: String,
    /// Where desks connect (mutual TLS), if they do.
    pub desks: Option<DeskListen>,
    /// The approvers' page, if there is one.
    pub web: Option<WebListen>,
}

/// The listener desks connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeskListen {
    /// Where it listens.
    pub listen: SocketAddr,
    /// Its certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// The approvers' page's listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebListen {
    /// Where it listens.
    pub listen: SocketAddr,
    /// Its origin as browsers see it; passkeys are bound to its host.
    pub origin: url::Url,
    /// Its certificate chain and key (PEM), when it serves TLS itself; plain HTTP otherwise
    /// (behind the TLS proxy that serves the origin, or on localhost).
    pub tls: Option<(PathBuf, PathBuf)>,
}

/// Why the server refuses to start. Every variant has a stable [`StartError::code`]; none
/// carries a secret's bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Writable, and no secret at all.
    #[error(
        "a writable server needs a signing secret: set CONFIRM_SECRET ({MIN_SECRET_BYTES} or more \
         bytes) or pass --secret-file FILE; or start it --read-only to serve only the tools that \
         change nothing"
    )]
    NoSecret,
    /// Both CONFIRM_SECRET and --secret-file: which one is meant is not for the server to guess.
    #[error("both CONFIRM_SECRET and --secret-file are given: keep one")]
    TwoSecrets,
    /// The secret is too short.
    #[error(
        "the signing secret ({from}) is {len} bytes; {MIN_SECRET_BYTES} or more are needed \
         (for example 32 random bytes: `head -c 32 /dev/urandom > secret`)"
    )]
    ShortSecret {
        /// Where it came from: `CONFIRM_SECRET` or `--secret-file`.
        from: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// Writable, and no control database.
    #[error(
        "a writable server needs CONTROL_DSN, the PostgreSQL control database that holds the \
         nonce ledger, approvals and history (e.g. `host=db.internal user=countersign \
         dbname=countersign sslmode=require`); or start it --read-only"
    )]
    NoControlDsn,
    /// `CONFIRM_TTL_MS` is not a whole number of ms within the bounds.
    #[error(
        "CONFIRM_TTL_MS must be a whole number of milliseconds from {MIN_TTL_MS} to {MAX_TTL_MS} \
         (default {DEFAULT_TOKEN_TTL_MS})"
    )]
    BadTtl,
    /// Neither TLS nor `--behind-tls-proxy`.
    #[error(
        "say how the server is reached: --tls-cert FILE --tls-key FILE to serve TLS itself, or \
         --behind-tls-proxy when a TLS-terminating proxy stands in front (or the address is \
         loopback)"
    )]
    NoTransport,
    /// A non-loopback address without any `--allowed-host`: every Host would be answered,
    /// which lets a web page reach the server by DNS rebinding.
    #[error(
        "{listen} is not a loopback address: name the Host names clients use with \
         --allowed-host NAME (repeatable)"
    )]
    NoAllowedHost {
        /// The address.
        listen: SocketAddr,
    },
    /// No way to authenticate callers was named.
    #[error(
        "say how callers are authenticated: --issuer URL --resource URL with --jwks-url URL or \
         --jwt-key-file FILE (OAuth bearer tokens), or --unauthenticated on a loopback address"
    )]
    NoAuthentication,
    /// `--unauthenticated` on an address others can reach.
    #[error("--unauthenticated is for loopback addresses only; {listen} is not one")]
    UnauthenticatedInTheOpen {
        /// The address.
        listen: SocketAddr,
    },
    /// `--agent-keys` on a server whose records go with the process.
    #[error(
        "--agent-keys needs records that last: CONTROL_DSN, or --data-dir for a read-only server"
    )]
    AgentKeysNowhere,
    /// `--issuer` without where its keys are.
    #[error("--issuer needs the issuer's keys: --jwks-url URL or --jwt-key-file FILE")]
    NoIssuerKeys,
    /// A URL that must be HTTPS is not (plain HTTP only to loopback).
    #[error("{what} must be an https:// URL (http:// only to a loopback host)")]
    NotHttps {
        /// Which option.
        what: &'static str,
    },
    /// An `--allowed-host` or `--allowed-origin` that could never match.
    #[error(
        "{option} {value:?} could never match: a host is `name` or `name:port`, an origin \
         `scheme://host[:port]` with nothing after"
    )]
    BadAllowList {
        /// Which option.
        option: &'static str,
        /// The value given.
        value: String,
    },
    /// No upstream, or more than one.
    #[error(
        "name the upstream: --db PATH (the built-in SQLite tools), --url URL, or -- COMMAND ARGS"
    )]
    NoUpstream,
    /// The `--db` path cannot be made absolute.
    #[error("--db {0}: cannot resolve the path")]
    BadDb(String),
    /// An approver listener on a read-only server, which has nothing to approve.
    #[error("--approver-listen: a read-only server has nothing to approve")]
    ApproversReadOnly,
    /// An approver listener without a certificate: it is mutual TLS or nothing.
    #[error(
        "--approver-listen needs a certificate of its own: --approver-cert FILE --approver-key \
         FILE, or --tls-cert/--tls-key to share the server's"
    )]
    ApproversWithoutTls,
    /// The PagerDuty routing key file cannot be read, or is empty.
    #[error("--pagerduty-routing-key-file {0}: cannot read a routing key from it")]
    BadRoutingKey(String),
    /// `--approver-url` without a listener, or a listener without `--approver-url`.
    #[error(
        "approvers need both a name and a place: --approver-url URL (every decision names it) \
         with --approver-listen ADDR (desks) and/or --approver-web ADDR (the passkey page)"
    )]
    ApproversNowhere,
    /// `--approver-web-origin` that a passkey cannot be bound to.
    #[error(
        "--approver-web-origin must be https://HOST[:PORT] with nothing after (or \
         http://localhost:PORT to try it on one machine): passkeys are bound to its host"
    )]
    BadWebOrigin,
    /// The operator listener on the agents' or the approvers' address.
    #[error(
        "--operator-listen {listen} must be a port of its own, not the agents' or the approvers'"
    )]
    OperatorSharesPort {
        /// The address.
        listen: SocketAddr,
    },
}

impl StartError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            StartError::NoSecret => "no_secret",
            StartError::TwoSecrets => "two_secrets",
            StartError::ShortSecret { .. } => "short_secret",
            StartError::NoControlDsn => "no_control_dsn",
            StartError::BadTtl => "bad_ttl",
            StartError::NoTransport => "no_transport",
            StartError::NoAllowedHost { .. } => "no_allowed_host",
            StartError::NoAuthentication => "no_authentication",
            StartError::UnauthenticatedInTheOpen { .. } => "unauthenticated_in_the_open",
            StartError::NoIssuerKeys => "no_issuer_keys",
            StartError::AgentKeysNowhere => "agent_keys_nowhere",
            StartError::NotHttps { .. } => "not_https",
            StartError::BadAllowList { .. } => "bad_allow_list",
            StartError::NoUpstream => "no_upstream",
            StartError::BadDb(_) => "bad_db",
            StartError::ApproversReadOnly => "approvers_read_only",
            StartError::ApproversWithoutTls => "approvers_without_tls",
            StartError::OperatorSharesPort { .. } => "operator_shares_port",
            StartError::ApproversNowhere => "approvers_nowhere",
            StartError::BadWebOrigin => "bad_web_origin",
            StartError::BadRoutingKey(_) => "bad_routing_key",
        }
    }
}

/// The Host names a loopback listener answers to by default.
pub const LOOPBACK_HOSTS: &[&str] = &["localhost", "127.0.0.1", "[::1]"];

/// Decides whether the server may start as asked: the seed's rules first (a writable server's
/// secret and control database, the token lifetime), then how it is reached, who may call it,
/// and its upstream.
/// `cwd` makes a relative `--db` absolute.
pub fn check(args: &Args, given: Given, cwd: &std::path::Path) -> Result<Start, StartError> {
    let Given {
        confirm_secret,
        secret_file,
        confirm_ttl_ms,
        control_dsn,
        servers,
        policy,
        rules,
        otlp,
    } = given;
    let dsn = control_dsn.filter(|d| !d.trim().is_empty()).map(Dsn);
    let secret_given = confirm_secret.is_some() || secret_file.is_some();
    let mode = if args.read_only {
        Mode::ReadOnly { dsn }
    } else {
        let (from, secret) = match (confirm_secret, secret_file) {
            (Some(_), Some(_)) => return Err(StartError::TwoSecrets),
            (None, None) => return Err(StartError::NoSecret),
            (Some(env), None) => ("CONFIRM_SECRET", env),
            (None, Some(mut file)) => {
                // A file written by `echo` ends with a newline that is not part of the secret.
                if file.last() == Some(&b'\n') {
                    file.pop();
                    if file.last() == Some(&b'\r') {
                        file.pop();
                    }
                }
                ("--secret-file", file)
            }
        };
        let key = SigningKey::new(&secret).map_err(|_| StartError::ShortSecret {
            from,
            len: secret.len(),
        })?;
        let dsn = dsn.ok_or(StartError::NoControlDsn)?;
        Mode::Writable { key, dsn }
    };
    // A read-only server mints nothing: the lifetime of a token is not its business.
    let token_ttl_ms = match confirm_ttl_ms.as_deref().map(str::trim) {
        _ if args.read_only => DEFAULT_TOKEN_TTL_MS,
        None | Some("") => DEFAULT_TOKEN_TTL_MS,
        Some(text) => text
            .parse::<u64>()
            .ok()
            .filter(|ms| (MIN_TTL_MS..=MAX_TTL_MS).contains(ms))
            .ok_or(StartError::BadTtl)?,
    };
    let transport = match (&args.tls_cert, &args.tls_key, args.behind_tls_proxy) {
        (Some(cert), Some(key), false) => Transport::Tls {
            cert: cert.clone(),
            key: key.clone(),
        },
        (None, None, true) => Transport::Plain,
        _ => return Err(StartError::NoTransport),
    };
    let loopback = args.listen.ip().is_loopback();
    if !loopback && args.allowed_hosts.is_empty() {
        return Err(StartError::NoAllowedHost {
            listen: args.listen,
        });
    }
    for (option, values, valid) in [
        (
            "--allowed-host",
            &args.allowed_hosts,
            crate::guard::valid_host_entry as fn(&str) -> bool,
        ),
        (
            "--allowed-origin",
            &args.allowed_origins,
            crate::guard::valid_origin_entry,
        ),
    ] {
        if let Some(bad) = values.iter().find(|v| !valid(v)) {
            return Err(StartError::BadAllowList {
                option,
                value: bad.clone(),
            });
        }
    }
    let allowed_hosts = if args.allowed_hosts.is_empty() {
        LOOPBACK_HOSTS.iter().map(|h| (*h).to_owned()).collect()
    } else {
        args.allowed_hosts.clone()
    };
    let authn = authn(args)?;
    let records_last = !matches!(mode, Mode::ReadOnly { dsn: None }) || args.data_dir.is_some();
    if matches!(
        authn,
        Authn::Bearer {
            agent_keys: true,
            ..
        }
    ) && !records_last
    {
        return Err(StartError::AgentKeysNowhere);
    }
    let approvers = match &args.approver_url {
        Some(url) => {
            if args.read_only {
                return Err(StartError::ApproversReadOnly);
            }
            if args.approver_listen.is_none() && args.approver_web.is_none() {
                return Err(StartError::ApproversNowhere);
            }
            // The name desks enroll with, and the desks' listener is always TLS: a plain
            // http:// URL could never be reached.
            if !url.to_ascii_lowercase().starts_with("https://") || url.len() <= 8 {
                return Err(StartError::NotHttps {
                    what: "--approver-url",
                });
            }
            let desks = match args.approver_listen {
                Some(listen) => {
                    let (cert, key) = match (&args.approver_cert, &args.approver_key, &transport) {
                        (Some(cert), Some(key), _) => (cert.clone(), key.clone()),
                        (None, None, Transport::Tls { cert, key }) => (cert.clone(), key.clone()),
                        _ => return Err(StartError::ApproversWithoutTls),
                    };
                    Some(DeskListen { listen, cert, key })
                }
                None => None,
            };
            let web = match (args.approver_web, &args.approver_web_origin) {
                (Some(listen), Some(origin)) => {
                    let origin = crate::web::passkey::origin(origin)
                        .map_err(|_| StartError::BadWebOrigin)?;
                    let tls = match (&args.approver_web_cert, &args.approver_web_key, &transport) {
                        (Some(cert), Some(key), _) => Some((cert.clone(), key.clone())),
                        (None, None, Transport::Tls { cert, key }) => {
                            Some((cert.clone(), key.clone()))
                        }
                        _ => None,
                    };
                    Some(WebListen {
                        listen,
                        origin,
                        tls,
                    })
                }
                _ => None,
            };
            Some(ApproverListen {
                url: url.clone(),
                desks,
                web,
            })
        }
        None if args.approver_listen.is_some() || args.approver_web.is_some() => {
            return Err(StartError::ApproversNowhere);
        }
        None => None,
    };
    if let Some(operator) = args.operator_listen {
        let shared = |other: SocketAddr| {
            other.port() != 0
                && other.port() == operator.port()
                && (other.ip() == operator.ip()
                    || other.ip().is_unspecified()
                    || operator.ip().is_unspecified())
        };
        if shared(args.listen)
            || args.approver_listen.is_some_and(shared)
            || args.approver_web.is_some_and(shared)
        {
            return Err(StartError::OperatorSharesPort { listen: operator });
        }
    }
    let mut webhooks = Vec::new();
    for url in &args.webhooks {
        https("--webhook", url)?;
        webhooks.push(crate::notify::Webhook::Json(url.clone()));
    }
    for url in &args.slack_webhooks {
        https("--slack-webhook", url)?;
        webhooks.push(crate::notify::Webhook::Slack(url.clone()));
    }
    for url in &args.teams_webhooks {
        https("--teams-webhook", url)?;
        webhooks.push(crate::notify::Webhook::Teams(url.clone()));
    }
    if let Some(file) = &args.pagerduty_routing_key_file {
        let url = args
            .pagerduty_url
            .clone()
            .unwrap_or_else(|| crate::notify::PAGERDUTY_URL.to_owned());
        https("--pagerduty-url", &url)?;
        let key = std::fs::read_to_string(file)
            .map(|k| zeroize::Zeroizing::new(k.trim().to_owned()))
            .ok()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| StartError::BadRoutingKey(file.display().to_string()))?;
        webhooks.push(crate::notify::Webhook::PagerDuty {
            url,
            routing_key: key,
        });
    }
    let upstreams = match servers {
        Some(servers) => Upstreams::Named(servers),
        None => Upstreams::One(upstream(args, cwd)?),
    };
    Ok(Start {
        operator: args.operator_listen,
        webhooks,
        approvers,
        listen: args.listen,
        secret_ignored: args.read_only && secret_given,
        mode,
        token_ttl_ms,
        transport,
        allowed_hosts,
        allowed_origins: args.allowed_origins.clone(),
        authn,
        upstreams,
        policy: policy.unwrap_or_default(),
        rules,
        rules_file: args.rules.as_ref().map(|path| cwd.join(path)),
        rules_approvers: args.rules_approvers,
        data_dir: args.data_dir.clone(),
        otlp,
        wait_secs: args.wait,
    })
}

fn authn(args: &Args) -> Result<Authn, StartError> {
    if args.unauthenticated {
        return if args.listen.ip().is_loopback() {
            Ok(Authn::Unauthenticated)
        } else {
            Err(StartError::UnauthenticatedInTheOpen {
                listen: args.listen,
            })
        };
    }
    let oauth = match (&args.issuer, &args.resource) {
        (Some(issuer), Some(resource)) => Some(oauth(args, issuer, resource)?),
        _ => None,
    };
    if oauth.is_none() && !args.agent_keys {
        return Err(StartError::NoAuthentication);
    }
    Ok(Authn::Bearer {
        oauth,
        agent_keys: args.agent_keys,
    })
}

fn oauth(args: &Args, issuer: &str, resource: &str) -> Result<OAuthSettings, StartError> {
    https("--issuer", issuer)?;
    https("--resource", resource)?;
    let keys = match (&args.jwks_url, &args.jwt_key_file) {
        (Some(url), None) => {
            https("--jwks-url", url)?;
            KeySource::Jwks(url.clone())
        }
        (None, Some(file)) => KeySource::File(file.clone()),
        _ => return Err(StartError::NoIssuerKeys),
    };
    Ok(OAuthSettings {
        issuer: issuer.to_owned(),
        resource: resource.to_owned(),
        scope: args.scope.clone(),
        keys,
    })
}

/// `url` is HTTPS, or HTTP to a loopback host.
fn https(what: &'static str, url: &str) -> Result<(), StartError> {
    let lower = url.to_ascii_lowercase();
    let ok = if let Some(rest) = lower.strip_prefix("https://") {
        !rest.is_empty()
    } else if let Some(rest) = lower.strip_prefix("http://") {
        let host = rest.split(['/', '?', '#']).next().unwrap_or("");
        let name = host.rsplit_once(':').map_or(host, |(n, p)| {
            if p.bytes().all(|b| b.is_ascii_digit()) {
                n
            } else {
                host
            }
        });
        matches!(name, "localhost" | "127.0.0.1" | "[::1]")
    } else {
        false
    };
    if ok {
        Ok(())
    } else {
        Err(StartError::NotHttps { what })
    }
}

fn upstream(args: &Args, cwd: &std::path::Path) -> Result<Reach, StartError> {
    match (&args.db, &args.url, args.command.is_empty()) {
        (Some(db), None, true) => {
            let path = cwd.join(db);
            let db = path
                .to_str()
                .ok_or_else(|| StartError::BadDb(db.display().to_string()))?
                .to_owned();
            Ok(Reach::Builtin { db })
        }
        (None, Some(url), true) => Ok(Reach::Url { url: url.clone() }),
        (None, None, false) => Ok(Reach::Command {
            argv: args.command.clone(),
            cwd: cwd.display().to_string(),
            // The upstream's environment is the server's, less what is the server's alone.
            env: std::env::vars()
                .filter(|(k, _)| !OWN_VARIABLES.contains(&k.as_str()))
                .collect(),
        }),
        _ => Err(StartError::NoUpstream),
    }
}

/// The server's own variables: never handed to an upstream.
/// (The collector's headers often carry its API key.)
pub const OWN_VARIABLES: &[&str] = &[
    "CONFIRM_SECRET",
    "CONTROL_DSN",
    "CONFIRM_TTL_MS",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
];

#[cfg(test)]
mod tests {
    use clap::Parser;
    use proptest::prelude::*;

    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["countersign serve", "--listen", "127.0.0.1:0"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).unwrap()
    }

    fn secret(n: usize) -> Option<Zeroizing<Vec<u8>>> {
        Some(Zeroizing::new(vec![b'k'; n]))
    }

    fn dsn() -> Option<Zeroizing<String>> {
        Some(Zeroizing::new("host=127.0.0.1 password=hunter2".into()))
    }

    fn writable() -> Given {
        Given {
            confirm_secret: secret(32),
            control_dsn: dsn(),
            ..Given::default()
        }
    }

    const PLAIN: &[&str] = &[
        "--behind-tls-proxy",
        "--unauthenticated",
        "--db",
        "t.sqlite",
    ];

    fn start(extra: &[&str], given: Given) -> Result<Start, StartError> {
        check(&args(extra), given, std::path::Path::new("/srv"))
    }

    #[test]
    fn a_writable_server_without_a_secret_is_refused_naming_the_variable_and_read_only() {
        let given = Given {
            control_dsn: dsn(),
            ..Given::default()
        };
        let err = start(PLAIN, given).unwrap_err();
        assert_eq!(err, StartError::NoSecret);
        let text = err.to_string();
        assert!(
            text.contains("CONFIRM_SECRET") && text.contains("--read-only"),
            "{text}"
        );
    }

    #[test]
    fn a_secret_under_32_bytes_is_refused_with_its_length_and_never_its_bytes() {
        let given = Given {
            confirm_secret: Some(Zeroizing::new(b"0123456789abcdefghijklmnopqrstu".to_vec())),
            control_dsn: dsn(),
            ..Given::default()
        };
        let err = start(PLAIN, given).unwrap_err();
        assert_eq!(
            err,
            StartError::ShortSecret {
                from: "CONFIRM_SECRET",
                len: 31
            }
        );
        assert!(err.to_string().contains("31 bytes"));
        assert!(!format!("{err} {err:?}").contains("0123456789"));
    }

    #[test]
    fn a_secret_file_loses_its_final_newline_only() {
        let given = Given {
            secret_file: Some(Zeroizing::new([vec![b'k'; 32], b"\n".to_vec()].concat())),
            control_dsn: dsn(),
            ..Given::default()
        };
        assert!(start(PLAIN, given).is_ok());
        let given = Given {
            secret_file: Some(Zeroizing::new([vec![b'k'; 31], b"\n".to_vec()].concat())),
            control_dsn: dsn(),
            ..Given::default()
        };
        assert_eq!(
            start(PLAIN, given).unwrap_err(),
            StartError::ShortSecret {
                from: "--secret-file",
                len: 31
            }
        );
    }

    #[test]
    fn two_secrets_are_refused_rather_than_one_guessed() {
        let given = Given {
            secret_file: secret(40),
            ..writable()
        };
        assert_eq!(start(PLAIN, given).unwrap_err(), StartError::TwoSecrets);
    }

    #[test]
    fn a_writable_server_without_a_control_database_is_refused() {
        let given = Given {
            confirm_secret: secret(32),
            ..Given::default()
        };
        let err = start(PLAIN, given).unwrap_err();
        assert_eq!(err, StartError::NoControlDsn);
        assert!(err.to_string().contains("CONTROL_DSN"));
        let blank = Given {
            control_dsn: Some(Zeroizing::new("  ".into())),
            ..writable()
        };
        assert_eq!(start(PLAIN, blank).unwrap_err(), StartError::NoControlDsn);
    }

    #[test]
    fn a_read_only_server_starts_without_secret_or_database_and_says_a_given_secret_is_ignored() {
        let ro = [
            "--read-only",
            "--behind-tls-proxy",
            "--unauthenticated",
            "--db",
            "t",
        ];
        let started = start(&ro, Given::default()).unwrap();
        assert!(matches!(started.mode, Mode::ReadOnly { dsn: None }));
        assert!(!started.secret_ignored);
        let given = Given {
            confirm_secret: secret(3),
            ..Given::default()
        };
        let started = start(&ro, given).unwrap();
        assert!(
            started.secret_ignored,
            "a short secret is not checked, only ignored"
        );
    }

    #[test]
    fn the_token_lifetime_is_ten_minutes_unless_set_within_bounds() {
        assert_eq!(start(PLAIN, writable()).unwrap().token_ttl_ms, 600_000);
        let ttl = |text: &str| {
            start(
                PLAIN,
                Given {
                    confirm_ttl_ms: Some(text.into()),
                    ..writable()
                },
            )
            .map(|s| s.token_ttl_ms)
        };
        assert_eq!(ttl("120000"), Ok(120_000));
        assert_eq!(ttl(" 1000 "), Ok(1_000));
        for bad in [
            "abc",
            "0",
            "999",
            "-5",
            "1.5",
            "86400001",
            "99999999999999999999999",
        ] {
            assert_eq!(ttl(bad), Err(StartError::BadTtl), "{bad}");
        }
    }

    #[test]
    fn how_the_server_is_reached_must_be_said() {
        let err = start(&["--unauthenticated", "--db", "t"], writable()).unwrap_err();
        assert_eq!(err, StartError::NoTransport);
        let tls = start(
            &[
                "--tls-cert",
                "c.pem",
                "--tls-key",
                "k.pem",
                "--unauthenticated",
                "--db",
                "t",
            ],
            writable(),
        )
        .unwrap();
        assert_eq!(
            tls.transport,
            Transport::Tls {
                cert: "c.pem".into(),
                key: "k.pem".into()
            }
        );
        assert!(
            Args::try_parse_from([
                "countersign serve",
                "--listen",
                "127.0.0.1:1",
                "--tls-cert",
                "c.pem",
                "--behind-tls-proxy",
            ])
            .is_err()
        );
    }

    #[test]
    fn a_public_address_needs_its_host_names() {
        let argv = |extra: &[&str]| {
            let mut v = vec!["countersign serve", "--listen", "0.0.0.0:8443"];
            v.extend_from_slice(extra);
            Args::try_parse_from(v).unwrap()
        };
        let cwd = std::path::Path::new("/srv");
        let oauth = [
            "--behind-tls-proxy",
            "--db",
            "t",
            "--issuer",
            "https://id.example.com",
            "--resource",
            "https://mcp.example.com/mcp",
            "--jwks-url",
            "https://id.example.com/jwks",
        ];
        let err = check(&argv(&oauth), writable(), cwd).unwrap_err();
        assert!(matches!(err, StartError::NoAllowedHost { .. }), "{err:?}");
        let mut extra = oauth.to_vec();
        extra.extend(["--allowed-host", "mcp.example.com"]);
        let ok = check(&argv(&extra), writable(), cwd).unwrap();
        assert_eq!(ok.allowed_hosts, ["mcp.example.com"]);
        assert_eq!(
            start(PLAIN, writable()).unwrap().allowed_hosts,
            LOOPBACK_HOSTS
        );
    }

    #[test]
    fn exactly_one_upstream_is_named_and_a_relative_db_is_made_absolute() {
        let err = start(&["--behind-tls-proxy", "--unauthenticated"], writable()).unwrap_err();
        assert_eq!(err, StartError::NoUpstream);
        let s = start(PLAIN, writable()).unwrap();
        assert!(
            matches!(&s.upstreams, Upstreams::One(Reach::Builtin { db }) if db == "/srv/t.sqlite"),
            "{:?}",
            s.upstreams
        );
        let s = start(
            &[
                "--behind-tls-proxy",
                "--unauthenticated",
                "--",
                "srv",
                "--flag",
            ],
            writable(),
        )
        .unwrap();
        let Upstreams::One(Reach::Command { argv, env, .. }) = s.upstreams else {
            panic!()
        };
        assert_eq!(argv, ["srv", "--flag"]);
        assert!(
            env.iter()
                .all(|(k, _)| !OWN_VARIABLES.contains(&k.as_str()))
        );
    }

    #[test]
    fn nothing_started_shows_the_secret_or_the_password() {
        let s = start(PLAIN, writable()).unwrap();
        let shown = format!("{s:?} {:?}", writable());
        assert!(
            !shown.contains("kkkk") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[test]
    fn callers_must_be_authenticated_unless_the_server_is_on_loopback_and_says_so() {
        let err = start(&["--behind-tls-proxy", "--db", "t"], writable()).unwrap_err();
        assert_eq!(err, StartError::NoAuthentication);
        let public = Args::try_parse_from([
            "countersign serve",
            "--listen",
            "10.0.0.5:8443",
            "--allowed-host",
            "mcp.internal",
            "--behind-tls-proxy",
            "--unauthenticated",
            "--db",
            "t",
        ])
        .unwrap();
        assert!(matches!(
            check(&public, writable(), std::path::Path::new("/")),
            Err(StartError::UnauthenticatedInTheOpen { .. })
        ));
        let base = [
            "--behind-tls-proxy",
            "--db",
            "t",
            "--issuer",
            "https://id.example.com",
            "--resource",
            "https://mcp.example.com/mcp",
        ];
        assert_eq!(
            start(&base, writable()).unwrap_err(),
            StartError::NoIssuerKeys
        );
        let with = |extra: &[&str]| {
            let mut all = base.to_vec();
            all.extend_from_slice(extra);
            start(&all, writable()).map(|s| s.authn)
        };
        assert_eq!(
            with(&[
                "--jwks-url",
                "https://id.example.com/jwks",
                "--scope",
                "mcp"
            ]),
            Ok(Authn::Bearer {
                oauth: Some(OAuthSettings {
                    issuer: "https://id.example.com".into(),
                    resource: "https://mcp.example.com/mcp".into(),
                    scope: Some("mcp".into()),
                    keys: KeySource::Jwks("https://id.example.com/jwks".into()),
                }),
                agent_keys: false,
            })
        );
        assert_eq!(
            with(&["--jwks-url", "http://id.example.com/jwks"]),
            Err(StartError::NotHttps { what: "--jwks-url" })
        );
        assert!(with(&["--jwks-url", "http://127.0.0.1:9000/jwks"]).is_ok());
        assert!(with(&["--jwks-url", "http://localhost.evil.example/jwks"]).is_err());
        assert!(with(&["--jwt-key-file", "issuer.pem"]).is_ok());
        // Agent keys alone, or beside OAuth; but never kept where they go with the process.
        let keys = start(
            &["--behind-tls-proxy", "--db", "t", "--agent-keys"],
            writable(),
        );
        assert_eq!(
            keys.map(|s| s.authn),
            Ok(Authn::Bearer {
                oauth: None,
                agent_keys: true
            })
        );
        let ro = [
            "--read-only",
            "--behind-tls-proxy",
            "--db",
            "t",
            "--agent-keys",
        ];
        assert_eq!(
            start(&ro, Given::default()).unwrap_err(),
            StartError::AgentKeysNowhere
        );
        let mut kept = ro.to_vec();
        kept.extend(["--data-dir", "/var/lib/countersign"]);
        assert!(start(&kept, Given::default()).is_ok());
    }

    #[test]
    fn the_operator_listener_gets_a_port_of_its_own() {
        let with = |operator: &str| {
            let mut extra = PLAIN.to_vec();
            extra.extend(["--operator-listen", operator]);
            let argv = ["countersign serve", "--listen", "127.0.0.1:8443"]
                .into_iter()
                .chain(extra)
                .collect::<Vec<_>>();
            check(
                &Args::try_parse_from(argv).unwrap(),
                writable(),
                std::path::Path::new("/srv"),
            )
            .map(|s| s.operator)
        };
        assert_eq!(
            with("127.0.0.1:9464"),
            Ok(Some("127.0.0.1:9464".parse().unwrap()))
        );
        for shared in ["127.0.0.1:8443", "0.0.0.0:8443"] {
            assert!(
                matches!(with(shared), Err(StartError::OperatorSharesPort { .. })),
                "{shared}"
            );
        }
        assert_eq!(start(PLAIN, writable()).unwrap().operator, None);
    }

    proptest! {
        #[test]
        fn no_refusal_of_a_secret_shows_its_bytes(bytes in proptest::collection::vec(b'a'..=b'z', 8..32)) {
            let given = Given {
                confirm_secret: Some(Zeroizing::new(bytes.clone())),
                control_dsn: dsn(),
                ..Given::default()
            };
            let err = start(PLAIN, given).unwrap_err();
            let text = String::from_utf8(bytes).unwrap();
            let shown = format!("{err} {err:?}");
            prop_assert!(!shown.contains(&text), "{shown}");
        }
    }
}
