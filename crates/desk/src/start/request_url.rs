//! A request URL on the desk's command line (`countersign://request/<id>`, from the desktop entry
//! or `countersign open`): read strictly before anything starts; anything else does nothing.

/// Why the desk's command line names no request it can open: the desk then starts nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestUrlError {
    /// More than one argument that is not an option.
    #[error("at most one countersign://request/<id> URL may be opened at a time")]
    MoreThanOne,
    /// The argument is not a request URL, read strictly.
    #[error(
        "not a request URL ({0}); it opens nothing. A request URL is exactly \
         countersign://request/<id>"
    )]
    NotARequestUrl(#[source] countersign_wire::BadRequestUrl),
}

/// The request a URL on the desk's command line names, if any. The arguments that are not
/// options (not starting with `-`) are read as one request URL: at most one, read strictly.
pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Option<u64>, RequestUrlError> {
    let mut urls = args.into_iter().filter(|a| !a.starts_with('-'));
    let Some(url) = urls.next() else {
        return Ok(None);
    };
    if urls.next().is_some() {
        return Err(RequestUrlError::MoreThanOne);
    }
    countersign_wire::parse_request_url(&url)
        .map(Some)
        .map_err(RequestUrlError::NotARequestUrl)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_desk_started_with_a_request_url_wants_that_request() {
        assert_eq!(from_args(args(&[])), Ok(None));
        assert_eq!(from_args(args(&["--in-memory-secret"])), Ok(None));
        assert_eq!(
            from_args(args(&["--in-memory-secret", "countersign://request/12"])),
            Ok(Some(12))
        );
    }

    #[test]
    fn anything_but_one_strict_request_url_is_refused() {
        for bad in [
            &["countersign://request/1?approve=1"][..],
            &["countersign://request/1/approve"],
            &["COUNTERSIGN://request/1"],
            &["https://example.com/"],
            &["countersign://request/99999999999999999999999"],
            &["countersign://request/1", "countersign://request/2"],
            &[""],
        ] {
            let refused = from_args(args(bad)).unwrap_err().to_string();
            assert!(refused.contains("countersign://request/<id>"), "{refused}");
        }
    }
}
