//! `countersign://request/<id>`: the address of one waiting request in the desk.
//!
//! A client in the 2026-07-28 flow is sent this URL (a URL-mode elicitation) and opens it; the
//! operating system hands it to the desk, or `countersign open` sends it. Whoever wrote the URL
//! may be hostile (an agent can put any text in front of a person and ask them to open it), so it
//! is read strictly and it can only choose which request the window shows: the scheme exactly
//! `countersign`, the host exactly `request`, then a decimal id (ASCII digits, no sign, no leading
//! zero, within `u64`) and nothing else: no userinfo, port, query, fragment, further path,
//! percent-encoding or surrounding whitespace. Anything else is refused with a [`BadRequestUrl`]
//! and nothing happens. Opening a request never approves or denies it.

/// The scheme and host every request URL starts with.
pub const REQUEST_URL_PREFIX: &str = "countersign://request/";

/// The longest text read as a request URL, in bytes (a request URL is at most 42: the prefix and
/// the 20 digits of `u64::MAX`; a little longer is still read, to say precisely what is wrong).
pub const MAX_REQUEST_URL: usize = 128;

/// The URL naming request `id`.
pub fn request_url(id: u64) -> String {
    format!("{REQUEST_URL_PREFIX}{id}")
}

/// Why a text is not a request URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadRequestUrl {
    /// Longer than [`MAX_REQUEST_URL`] bytes: no request URL is.
    #[error("longer than any request URL ({MAX_REQUEST_URL} bytes at most)")]
    TooLong,
    /// The scheme is not exactly `countersign` (another scheme, another case, leading space).
    #[error("the scheme is not countersign:")]
    Scheme,
    /// What follows the scheme is not exactly `//request/` (another host, userinfo, a port).
    #[error("it does not name a request (countersign://request/<id>)")]
    NotRequest,
    /// The id is not a decimal number within 0..=18446744073709551615 written in ASCII digits
    /// without sign or leading zero.
    #[error("the request id is not a decimal number within 64 bits")]
    Id,
    /// Something follows the id (a path, a query, a fragment, whitespace).
    #[error("something follows the request id (a path, query or fragment)")]
    Trailing,
}

impl BadRequestUrl {
    /// The error as a code.
    pub fn code(self) -> &'static str {
        match self {
            BadRequestUrl::TooLong => "too_long",
            BadRequestUrl::Scheme => "scheme",
            BadRequestUrl::NotRequest => "not_request",
            BadRequestUrl::Id => "id",
            BadRequestUrl::Trailing => "trailing",
        }
    }
}

/// The id a request URL names, read strictly (see the module's doc).
pub fn parse_request_url(url: &str) -> Result<u64, BadRequestUrl> {
    if url.len() > MAX_REQUEST_URL {
        return Err(BadRequestUrl::TooLong);
    }
    let rest = url
        .strip_prefix("countersign:")
        .ok_or(BadRequestUrl::Scheme)?;
    let rest = rest
        .strip_prefix("//request/")
        .ok_or(BadRequestUrl::NotRequest)?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (id, after) = rest.split_at(digits);
    if id.is_empty() || (id.len() > 1 && id.starts_with('0')) {
        return Err(BadRequestUrl::Id);
    }
    let id: u64 = id.parse().map_err(|_| BadRequestUrl::Id)?;
    if !after.is_empty() {
        return Err(BadRequestUrl::Trailing);
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_url_names_its_id_and_round_trips() {
        assert_eq!(parse_request_url("countersign://request/7"), Ok(7));
        assert_eq!(parse_request_url("countersign://request/0"), Ok(0));
        assert_eq!(
            parse_request_url("countersign://request/18446744073709551615"),
            Ok(u64::MAX)
        );
        for id in [0, 1, 42, u64::MAX] {
            assert_eq!(parse_request_url(&request_url(id)), Ok(id));
        }
        assert!(request_url(u64::MAX).len() <= MAX_REQUEST_URL);
    }

    #[test]
    fn other_schemes_and_cases_are_refused() {
        for url in [
            "COUNTERSIGN://request/1",
            "Countersign://request/1",
            "https://request/1",
            "countersigned://request/1",
            "countersign-x://request/1",
            "xcountersign://request/1",
            "countersign//request/1",
            " countersign://request/1",
            "\u{feff}countersign://request/1",
            "countersign%3A//request/1",
            "",
        ] {
            assert_eq!(
                parse_request_url(url),
                Err(BadRequestUrl::Scheme),
                "{url:?}"
            );
        }
    }

    #[test]
    fn another_host_userinfo_or_port_is_refused() {
        for url in [
            "countersign://REQUEST/1",
            "countersign://approve/1",
            "countersign://user@request/1",
            "countersign://request:80/1",
            "countersign:/request/1",
            "countersign:request/1",
            "countersign:///request/1",
            "countersign://request",
            "countersign://requests/1",
            "countersign://%72equest/1",
            "countersign://request%2F1",
        ] {
            assert_eq!(
                parse_request_url(url),
                Err(BadRequestUrl::NotRequest),
                "{url:?}"
            );
        }
    }

    #[test]
    fn ids_that_are_not_plain_decimal_within_u64_are_refused() {
        for url in [
            "countersign://request/",
            "countersign://request/99999999999999999999999",
            "countersign://request/18446744073709551616",
            "countersign://request/-1",
            "countersign://request/+1",
            "countersign://request/01",
            "countersign://request/00",
            "countersign://request/%31",
            "countersign://request/ 1",
            // Unicode digits: Arabic-Indic, full-width, superscript.
            "countersign://request/\u{0661}",
            "countersign://request/\u{ff11}",
            "countersign://request/\u{00b9}",
            "countersign://request/?approve=1",
        ] {
            assert_eq!(parse_request_url(url), Err(BadRequestUrl::Id), "{url:?}");
        }
    }

    #[test]
    fn anything_after_the_id_is_refused() {
        for url in [
            "countersign://request/1?approve=1",
            "countersign://request/1#approve",
            "countersign://request/1/approve",
            "countersign://request/1/",
            "countersign://request/1 ",
            "countersign://request/1\n",
            "countersign://request/1\0",
            "countersign://request/1%20",
            "countersign://request/1\u{0661}",
            "countersign://request/1\u{202e}",
            "countersign://request/1.0",
            "countersign://request/0x10",
        ] {
            assert_eq!(
                parse_request_url(url),
                Err(BadRequestUrl::Trailing),
                "{url:?}"
            );
        }
    }

    #[test]
    fn long_texts_are_refused_before_reading_them() {
        let long = format!("countersign://request/1{}", "0".repeat(10_000));
        assert_eq!(parse_request_url(&long), Err(BadRequestUrl::TooLong));
        let padded = format!("countersign://request/1?{}", "a".repeat(MAX_REQUEST_URL));
        assert_eq!(parse_request_url(&padded), Err(BadRequestUrl::TooLong));
    }

    #[test]
    fn every_error_has_a_code_and_a_sentence() {
        for e in [
            BadRequestUrl::TooLong,
            BadRequestUrl::Scheme,
            BadRequestUrl::NotRequest,
            BadRequestUrl::Id,
            BadRequestUrl::Trailing,
        ] {
            assert!(!e.code().is_empty() && !e.to_string().is_empty());
        }
    }
}
