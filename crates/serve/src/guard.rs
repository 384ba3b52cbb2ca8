//! Which Host and Origin may reach the server at all.
//!
//! A server on loopback or inside a network is still reachable from a browser on the same
//! machine or network: a web page can point a name it controls at the server's address (DNS
//! rebinding) and post to it. So every request must name a Host the server was told it answers
//! to, and a request carrying an Origin (a browser's) must come from one it was told to accept.
//! Both are checked before anything else reads the request.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The allow-lists.
#[derive(Debug, Clone)]
pub struct Guard {
    hosts: Vec<String>,
    origins: Vec<String>,
}

impl Guard {
    /// A guard answering to `hosts` (`name` for any port, or `name:port`) and accepting
    /// browser requests from `origins` (`scheme://host[:port]`). Compared without case.
    pub fn new(hosts: &[String], origins: &[String]) -> Self {
        let lower = |v: &[String]| v.iter().map(|s| s.trim().to_ascii_lowercase()).collect();
        Self {
            hosts: lower(hosts),
            origins: lower(origins),
        }
    }

    /// Whether `host` (a Host header's value or a URI's authority) is one the server answers to.
    pub fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        let Some((name, port)) = split_host(&host) else {
            return false;
        };
        self.hosts.iter().any(|allowed| match split_host(allowed) {
            Some((n, None)) => n == name,
            Some((n, Some(p))) => n == name && port == Some(p),
            None => false,
        })
    }

    /// Whether a request with this Origin may go on: none (not a browser's), or a listed one.
    pub fn origin_allowed(&self, origin: Option<&str>) -> bool {
        match origin {
            None => true,
            Some(origin) => {
                let origin = origin.trim().to_ascii_lowercase();
                self.origins.contains(&origin)
            }
        }
    }

    /// Why a request with these parts is refused, if it is.
    pub fn refuse(&self, authority: Option<&str>, headers: &HeaderMap) -> Option<Refused> {
        let host = match headers.get_all(header::HOST).iter().collect::<Vec<_>>()[..] {
            [] => authority.map(str::to_owned),
            [one] => {
                let host = one.to_str().ok().map(str::to_owned);
                // A request target or :authority that names another host than the Host header:
                // which one a proxy routed on is anyone's guess (RFC 9112 §3.2.2).
                if let Some(authority) = authority
                    && host
                        .as_deref()
                        .is_none_or(|h| !h.eq_ignore_ascii_case(authority))
                {
                    return Some(Refused::Host);
                }
                host
            }
            // Two Host headers: the same question.
            _ => return Some(Refused::Host),
        };
        if !host.is_some_and(|h| self.host_allowed(&h)) {
            return Some(Refused::Host);
        }
        let origins: Vec<_> = headers.get_all(header::ORIGIN).iter().collect();
        let origin = match origins[..] {
            [] => None,
            [one] => match one.to_str() {
                Ok(o) => Some(o),
                Err(_) => return Some(Refused::Origin),
            },
            _ => return Some(Refused::Origin),
        };
        (!self.origin_allowed(origin)).then_some(Refused::Origin)
    }
}

/// Whether `entry` can be an `--allowed-host`: `name` or `name:port`, nothing else.
pub fn valid_host_entry(entry: &str) -> bool {
    let entry = entry.trim();
    !entry.contains(['/', ' ', '@', '?', '#']) && split_host(&entry.to_ascii_lowercase()).is_some()
}

/// Whether `entry` can be an `--allowed-origin`: `scheme://host[:port]` and nothing after.
pub fn valid_origin_entry(entry: &str) -> bool {
    let Some((scheme, rest)) = entry.trim().split_once("://") else {
        return false;
    };
    matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https") && valid_host_entry(rest)
}

/// `name` and its port, if any, of `host:port`, `[v6]:port`, `name` or `[v6]`.
fn split_host(host: &str) -> Option<(&str, Option<&str>)> {
    if host.is_empty() {
        return None;
    }
    if let Some(rest) = host.strip_prefix('[') {
        let end = rest.find(']')?;
        let name = &host[..end + 2];
        return match &rest[end + 1..] {
            "" => Some((name, None)),
            port => port
                .strip_prefix(':')
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .map(|p| (name, Some(p))),
        };
    }
    match host.rsplit_once(':') {
        Some((name, port))
            if !name.is_empty()
                && !name.contains(':')
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Some((name, Some(port)))
        }
        Some(_) => None,
        None => Some((host, None)),
    }
}

/// Why the guard turned a request away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The Host is not one the server answers to.
    Host,
    /// The Origin is not one it accepts.
    Origin,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let (code, message) = match self {
            Refused::Host => (
                "host_not_allowed",
                "this server does not answer to that Host (see --allowed-host)",
            ),
            Refused::Origin => (
                "origin_not_allowed",
                "requests from that Origin are not accepted (see --allowed-origin)",
            ),
        };
        crate::http::refuse(StatusCode::FORBIDDEN, code, message)
    }
}

/// The guard as an axum middleware.
pub async fn layer(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let authority = request.uri().authority().map(|a| a.as_str().to_owned());
    match guard.refuse(authority.as_deref(), request.headers()) {
        Some(refused) => {
            tracing::info!(target: "serve", ?refused, host = ?request.headers().get(header::HOST), origin = ?request.headers().get(header::ORIGIN), "refused by the Host/Origin guard");
            refused.into_response()
        }
        None => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn guard() -> Guard {
        Guard::new(
            &[
                "localhost".into(),
                "[::1]".into(),
                "mcp.example.com:8443".into(),
            ],
            &["https://app.example.com".into()],
        )
    }

    #[test]
    fn a_listed_name_matches_any_port_and_a_listed_port_only_itself() {
        let g = guard();
        for ok in [
            "localhost",
            "LOCALHOST:9",
            "[::1]:80",
            "[::1]",
            "mcp.example.com:8443",
        ] {
            assert!(g.host_allowed(ok), "{ok}");
        }
        for bad in [
            "mcp.example.com",
            "mcp.example.com:443",
            "evil.example",
            "localhost.evil.example",
            "localhost:",
            "localhost:80:80",
            "[::1",
            "[::1]x",
            "::1",
            "",
            "localhost:8a",
        ] {
            assert!(!g.host_allowed(bad), "{bad}");
        }
    }

    #[test]
    fn no_origin_passes_a_listed_one_passes_any_other_is_refused() {
        let g = guard();
        assert!(g.origin_allowed(None));
        assert!(g.origin_allowed(Some("https://APP.example.com")));
        for bad in [
            "null",
            "https://app.example.com.evil",
            "http://app.example.com",
            "",
        ] {
            assert!(!g.origin_allowed(Some(bad)), "{bad}");
        }
    }

    #[test]
    fn two_host_or_two_origin_headers_are_refused() {
        let g = guard();
        let mut h = HeaderMap::new();
        h.append(header::HOST, HeaderValue::from_static("localhost"));
        assert_eq!(g.refuse(None, &h), None);
        h.append(header::HOST, HeaderValue::from_static("evil.example"));
        assert_eq!(g.refuse(None, &h), Some(Refused::Host));
        let mut h = HeaderMap::new();
        h.append(header::HOST, HeaderValue::from_static("localhost"));
        h.append(
            header::ORIGIN,
            HeaderValue::from_static("https://app.example.com"),
        );
        assert_eq!(g.refuse(None, &h), None);
        h.append(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert_eq!(g.refuse(None, &h), Some(Refused::Origin));
    }

    #[test]
    fn without_a_host_header_the_authority_is_checked_and_without_either_it_is_refused() {
        let g = guard();
        let h = HeaderMap::new();
        assert_eq!(g.refuse(Some("localhost:1"), &h), None);
        assert_eq!(g.refuse(Some("evil.example"), &h), Some(Refused::Host));
        assert_eq!(g.refuse(None, &h), Some(Refused::Host));
    }

    #[test]
    fn a_request_target_naming_another_host_than_the_host_header_is_refused() {
        let g = guard();
        let mut h = HeaderMap::new();
        h.append(header::HOST, HeaderValue::from_static("localhost"));
        assert_eq!(g.refuse(Some("localhost"), &h), None);
        assert_eq!(g.refuse(Some("evil.example"), &h), Some(Refused::Host));
    }

    #[test]
    fn allow_list_entries_must_be_host_names_and_origins() {
        assert!(valid_host_entry("mcp.example.com"));
        assert!(valid_host_entry("mcp.example.com:8443"));
        assert!(valid_host_entry("[::1]"));
        for bad in [
            "https://mcp.example.com/",
            "mcp.example.com/",
            "",
            "a b",
            "host:port",
        ] {
            assert!(!valid_host_entry(bad), "{bad}");
        }
        assert!(valid_origin_entry("https://app.example.com"));
        assert!(valid_origin_entry("http://localhost:3000"));
        for bad in [
            "https://app.example.com/",
            "app.example.com",
            "https://",
            "null",
            "*",
        ] {
            assert!(!valid_origin_entry(bad), "{bad}");
        }
    }
}
