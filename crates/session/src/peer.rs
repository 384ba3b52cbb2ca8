//! Who is on the other end of a connection, and what that account may ask the desk for.
//!
//! The kernel says which account opened a connection (the peer's credentials, not anything it
//! sends). The desk's own account may ask for anything a gateway can name. An account listed in
//! the desk's settings (an agent that runs under an account of its own) may connect, but may ask
//! only for what does not run as the desk's account on its word: a URL, which the desk connects
//! to and the agent's account could reach anyway, or a server registered in the desk. An ad-hoc
//! command would run as the desk's account with the agent's arguments and environment, and the
//! built-in tools would open any SQLite file the desk's account can read: either would hand that
//! account's files and authority to the agent's. Every other account is refused.
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use countersign_wire::{Reach, RefusedCode};
use tokio::net::UnixStream;

use crate::reach::Unreached;

/// The account on the other end of a connection that may be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    /// The desk's own account.
    Own,
    /// An account listed in the desk's settings.
    Listed(u32),
}

/// Why a connection is not served: the account's uid, when the kernel told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotAllowed(pub Option<u32>);

/// The peer of `stream`, if it is this account or one of `listed`.
pub(crate) fn identify(stream: &UnixStream, listed: &[u32]) -> Result<Peer, NotAllowed> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let me = unsafe { libc::getuid() };
    let uid = stream
        .peer_cred()
        .map(|cred| cred.uid())
        .map_err(|_| NotAllowed(None))?;
    if uid == me {
        Ok(Peer::Own)
    } else if listed.contains(&uid) {
        Ok(Peer::Listed(uid))
    } else {
        Err(NotAllowed(Some(uid)))
    }
}

impl NotAllowed {
    /// The sentence the refused gateway prints.
    pub(crate) fn message(self) -> String {
        // SAFETY: getuid has no preconditions and cannot fail.
        let me = unsafe { libc::getuid() };
        match self.0 {
            Some(uid) => format!(
                "this desk (uid {me}) serves its own account and the accounts listed in its \
                 settings (agent_accounts); uid {uid} is not listed"
            ),
            None => "this desk could not tell which account connected".to_owned(),
        }
    }
}

impl Peer {
    /// Whether this account may ask for `reach`.
    pub(crate) fn may_reach(self, reach: &Reach) -> Result<(), Unreached> {
        let uid = match self {
            Peer::Own => return Ok(()),
            Peer::Listed(uid) => uid,
        };
        match reach {
            Reach::Url { .. } | Reach::Server { .. } => Ok(()),
            Reach::Command { .. } => Err(listed_only(
                uid,
                "an ad-hoc command would run as the desk's account",
            )),
            Reach::Builtin { .. } => Err(listed_only(
                uid,
                "the built-in tools would open the file as the desk's account",
            )),
            _ => Err(listed_only(
                uid,
                "this desk does not know what it would run",
            )),
        }
    }
}

fn listed_only(uid: u32, why: &str) -> Unreached {
    Unreached {
        code: RefusedCode::AccountNotAllowed,
        message: format!(
            "uid {uid} is an agent account: it may reach a URL (--url) or a server registered in \
             the desk (--server), not this: {why}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_account_reaches_urls_and_registered_servers_only() {
        let listed = Peer::Listed(1234);
        assert!(
            listed
                .may_reach(&Reach::Url {
                    url: "http://127.0.0.1:1/mcp".into()
                })
                .is_ok()
        );
        assert!(
            listed
                .may_reach(&Reach::Server { name: "gh".into() })
                .is_ok()
        );
        for reach in [
            Reach::Command {
                argv: vec!["sh".into(), "-c".into(), "id".into()],
                cwd: "/".into(),
                env: vec![],
            },
            Reach::Builtin {
                db: "/home/person/.mozilla/cookies.sqlite".into(),
            },
        ] {
            let refused = listed.may_reach(&reach).unwrap_err();
            assert_eq!(refused.code, RefusedCode::AccountNotAllowed);
            assert!(refused.message.contains("uid 1234"), "{}", refused.message);
        }
        assert!(
            Peer::Own
                .may_reach(&Reach::Builtin { db: "/x".into() })
                .is_ok()
        );
    }

    #[tokio::test]
    async fn the_own_account_is_served_and_an_unlisted_one_is_not() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert_eq!(identify(&a, &[]), Ok(Peer::Own));
        // SAFETY: getuid has no preconditions.
        let me = unsafe { libc::getuid() };
        assert!(NotAllowed(Some(me + 1)).message().contains("not listed"));
    }
}
