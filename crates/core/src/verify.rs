//! The verification chain a confirm goes through, in the seed's order.
//!
//! Cheapest and most definite first: token present, signature, expiry, tenant, tool, target, plan
//! hash, and only then, for single-use tools, the ledger. A forged or stale token is decided here,
//! instantly and with no I/O, so a request already known to be bad never reaches the ledger. The
//! token is checked before `confirmTarget`: a caller who has not proven a preflight happened gets
//! one refusal, not a diagnostic about a target.

use crate::ledger::{Ledger, SpendError};
use crate::plan::PlanHash;
use crate::refusal::Refusal;
use crate::token::{self, Claims, SigningKey};

/// A confirm as the desk sees it. Everything here comes from the desk: the tenant it assigned to
/// the connection, the target and plan hash it resolved from the confirm's own arguments.
#[derive(Debug, Clone, Copy)]
pub struct Confirm<'a> {
    /// The `confirmToken` argument, if any. An empty string counts as none.
    pub token: Option<&'a str>,
    /// The `confirmTarget` argument, if any.
    pub confirm_target: Option<&'a str>,
    /// The connection the call arrived on, as assigned by the desk.
    pub tenant: &'a str,
    /// The tool called.
    pub tool: &'a str,
    /// The target the desk resolved from the call's arguments.
    pub target: &'a str,
    /// The hash of the plan the desk built from the call's arguments.
    pub plan: PlanHash,
}

/// A refused confirm: the refusal, and the token's claims when its signature held (so history can
/// tie a replay to its issuance by nonce).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Why.
    pub refusal: Refusal,
    /// The verified claims, when the token got past its signature check (boxed: refusals are
    /// the cold path, and a small `Result` keeps the hot one lean).
    pub claims: Option<Box<Claims>>,
}

impl Rejected {
    fn bare(refusal: Refusal) -> Self {
        Self {
            refusal,
            claims: None,
        }
    }
}

/// Runs the chain. `single_use` spends the nonce in `ledger` as the last step; otherwise the
/// ledger is never touched. On success returns the token's claims (its nonce keys the approved
/// arguments).
pub fn verify(
    key: &SigningKey,
    confirm: &Confirm<'_>,
    single_use: bool,
    now_ms: u64,
    ledger: &mut dyn Ledger,
) -> Result<Claims, Rejected> {
    let claims = check(key, confirm, now_ms)?;
    if !single_use {
        return Ok(claims);
    }
    let spent = ledger.spend(&claims.nonce, claims.exp);
    spent_as(claims, spent)
}

/// The chain up to the ledger: everything decided locally, with no I/O. A caller whose ledger
/// is asynchronous (a network database) runs this, spends the nonce of the claims it returns
/// when the tool is single-use, and hands the spend's result to [`spent_as`]; the order is the
/// seed's either way, and a bad token never reaches the ledger.
pub fn check(key: &SigningKey, confirm: &Confirm<'_>, now_ms: u64) -> Result<Claims, Rejected> {
    let text = match confirm.token {
        Some(text) if !text.is_empty() => text,
        _ => return Err(Rejected::bare(Refusal::NoToken)),
    };
    let claims = token::decode(key, text).map_err(|_| Rejected::bare(Refusal::BadToken))?;
    let refusal = if now_ms >= claims.exp {
        Refusal::Expired
    } else if claims.tenant != confirm.tenant {
        Refusal::WrongTenant
    } else if claims.tool != confirm.tool {
        Refusal::WrongTool
    } else if claims.target != confirm.target
        || confirm.confirm_target != Some(claims.target.as_str())
    {
        Refusal::WrongTarget
    } else if claims.plan != confirm.plan {
        Refusal::PlanChanged
    } else {
        return Ok(claims);
    };
    Err(Rejected {
        refusal,
        claims: Some(Box::new(claims)),
    })
}

/// The chain's last step: the ledger's answer to spending the nonce of `claims`, as the chain's
/// verdict. A duplicate is `already_used`; any other failure is `ledger_unreachable` (fail
/// closed: nothing runs).
pub fn spent_as(claims: Claims, spent: Result<(), SpendError>) -> Result<Claims, Rejected> {
    let refusal = match spent {
        Ok(()) => return Ok(claims),
        Err(SpendError::AlreadySpent) => Refusal::AlreadyUsed,
        Err(_) => Refusal::LedgerUnreachable,
    };
    Err(Rejected {
        refusal,
        claims: Some(Box::new(claims)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::MemoryLedger;
    use crate::token::{Nonce, mint};

    const NOW: u64 = 1_700_000_000_000;
    const TTL: u64 = 600_000;

    fn key() -> SigningKey {
        SigningKey::new(&[0x5a; 32]).unwrap()
    }

    fn claims() -> Claims {
        Claims {
            tool: "execute".into(),
            target: "main.db".into(),
            plan: PlanHash::from_bytes([1; 32]),
            tenant: "conn-1".into(),
            iat: NOW,
            exp: NOW + TTL,
            nonce: Nonce::from_bytes([8; 16]),
        }
    }

    fn token_text() -> String {
        mint(&key(), &claims()).expose().to_owned()
    }

    fn confirm(token: &str) -> Confirm<'_> {
        Confirm {
            token: Some(token),
            confirm_target: Some("main.db"),
            tenant: "conn-1",
            tool: "execute",
            target: "main.db",
            plan: PlanHash::from_bytes([1; 32]),
        }
    }

    /// A ledger that counts how often it is asked, to prove refused requests never reach it.
    #[derive(Default)]
    struct CountingLedger {
        inner: MemoryLedger,
        calls: usize,
        unreachable: bool,
    }

    impl Ledger for CountingLedger {
        fn spend(&mut self, nonce: &Nonce, exp: u64) -> Result<(), SpendError> {
            self.calls += 1;
            if self.unreachable {
                return Err(SpendError::Unreachable("disk on fire".into()));
            }
            self.inner.spend(nonce, exp)
        }
    }

    fn run(
        c: &Confirm<'_>,
        once: bool,
        now: u64,
        ledger: &mut CountingLedger,
    ) -> Result<Claims, Refusal> {
        verify(&key(), c, once, now, ledger).map_err(|r| r.refusal)
    }

    #[test]
    fn valid_once_token_is_accepted_and_spent() {
        let t = token_text();
        let mut ledger = CountingLedger::default();
        assert_eq!(run(&confirm(&t), true, NOW, &mut ledger), Ok(claims()));
        assert_eq!(ledger.inner.len(), 1);
    }

    #[test]
    fn replayed_once_token_is_refused() {
        let t = token_text();
        let mut ledger = CountingLedger::default();
        run(&confirm(&t), true, NOW, &mut ledger).unwrap();
        assert_eq!(
            run(&confirm(&t), true, NOW + 1, &mut ledger),
            Err(Refusal::AlreadyUsed)
        );
    }

    #[test]
    fn reusable_token_works_again_within_its_life_and_never_touches_the_ledger() {
        let t = token_text();
        let mut ledger = CountingLedger::default();
        for now in [NOW, NOW + 1, NOW + TTL - 1] {
            assert!(run(&confirm(&t), false, now, &mut ledger).is_ok());
        }
        assert_eq!(ledger.calls, 0);
    }

    #[test]
    fn missing_or_empty_token_is_no_token() {
        let mut ledger = CountingLedger::default();
        let mut c = confirm("");
        assert_eq!(run(&c, true, NOW, &mut ledger), Err(Refusal::NoToken));
        c.token = None;
        assert_eq!(run(&c, true, NOW, &mut ledger), Err(Refusal::NoToken));
    }

    #[test]
    fn forged_token_is_bad_token() {
        let other = SigningKey::new(&[0x11; 32]).unwrap();
        let forged = mint(&other, &claims());
        let mut ledger = CountingLedger::default();
        assert_eq!(
            run(&confirm(forged.expose()), true, NOW, &mut ledger),
            Err(Refusal::BadToken)
        );
        assert_eq!(
            run(&confirm("garbage"), true, NOW, &mut ledger),
            Err(Refusal::BadToken)
        );
    }

    #[test]
    fn token_at_or_after_its_expiry_is_expired() {
        let t = token_text();
        let mut ledger = CountingLedger::default();
        assert_eq!(
            run(&confirm(&t), true, NOW + TTL, &mut ledger),
            Err(Refusal::Expired)
        );
        assert_eq!(
            run(&confirm(&t), true, u64::MAX, &mut ledger),
            Err(Refusal::Expired)
        );
        assert!(run(&confirm(&t), true, NOW + TTL - 1, &mut ledger).is_ok());
    }

    #[test]
    fn token_from_another_connection_is_wrong_tenant() {
        let t = token_text();
        let mut c = confirm(&t);
        c.tenant = "conn-2";
        assert_eq!(
            run(&c, true, NOW, &mut CountingLedger::default()),
            Err(Refusal::WrongTenant)
        );
    }

    #[test]
    fn token_for_another_tool_is_wrong_tool() {
        let t = token_text();
        let mut c = confirm(&t);
        c.tool = "delete_backup";
        assert_eq!(
            run(&c, true, NOW, &mut CountingLedger::default()),
            Err(Refusal::WrongTool)
        );
    }

    #[test]
    fn other_resolved_target_is_wrong_target() {
        let t = token_text();
        let mut c = confirm(&t);
        c.target = "other.db";
        assert_eq!(
            run(&c, true, NOW, &mut CountingLedger::default()),
            Err(Refusal::WrongTarget)
        );
    }

    #[test]
    fn missing_or_other_confirm_target_is_wrong_target() {
        let t = token_text();
        let mut c = confirm(&t);
        c.confirm_target = Some("other.db");
        assert_eq!(
            run(&c, true, NOW, &mut CountingLedger::default()),
            Err(Refusal::WrongTarget)
        );
        c.confirm_target = None;
        assert_eq!(
            run(&c, true, NOW, &mut CountingLedger::default()),
            Err(Refusal::WrongTarget)
        );
    }

    #[test]
    fn token_checked_before_confirm_target() {
        let mut ledger = CountingLedger::default();
        let mut c = confirm("cs1.not.valid");
        c.confirm_target = Some("somewhere else");
        assert_eq!(run(&c, true, NOW, &mut ledger), Err(Refusal::BadToken));
        c.token = None;
        assert_eq!(run(&c, true, NOW, &mut ledger), Err(Refusal::NoToken));
    }

    #[test]
    fn changed_plan_is_plan_changed() {
        let t = token_text();
        let mut c = confirm(&t);
        c.plan = PlanHash::from_bytes([2; 32]);
        assert_eq!(
            run(&c, true, NOW, &mut CountingLedger::default()),
            Err(Refusal::PlanChanged)
        );
    }

    #[test]
    fn ledger_failure_is_ledger_unreachable() {
        let t = token_text();
        let mut ledger = CountingLedger {
            unreachable: true,
            ..Default::default()
        };
        assert_eq!(
            run(&confirm(&t), true, NOW, &mut ledger),
            Err(Refusal::LedgerUnreachable)
        );
        // It failed closed: once the ledger is back, the same token works (nothing was spent).
        ledger.unreachable = false;
        assert!(run(&confirm(&t), true, NOW, &mut ledger).is_ok());
    }

    #[test]
    fn refused_requests_never_reach_the_ledger() {
        let t = token_text();
        let mut ledger = CountingLedger::default();
        let variants: [fn(&mut Confirm<'_>); 7] = [
            |c| c.token = None,
            |c| c.token = Some("cs1.AAAA.AAAA"),
            |c| c.tenant = "x",
            |c| c.tool = "x",
            |c| c.target = "x",
            |c| c.confirm_target = Some("x"),
            |c| c.plan = PlanHash::from_bytes([0; 32]),
        ];
        for change in variants {
            let mut c = confirm(&t);
            change(&mut c);
            assert!(run(&c, true, NOW, &mut ledger).is_err());
        }
        assert!(run(&confirm(&t), true, NOW + TTL, &mut ledger).is_err());
        assert_eq!(ledger.calls, 0);
    }

    #[test]
    fn checks_run_in_the_seeds_order() {
        // A token wrong in every way is refused for the earliest failing check, step by step.
        let mut bad = claims();
        bad.tenant = "other".into();
        bad.tool = "other".into();
        bad.target = "other".into();
        bad.plan = PlanHash::from_bytes([9; 32]);
        let mut ledger = CountingLedger::default();
        let expired = mint(
            &key(),
            &Claims {
                exp: NOW,
                ..bad.clone()
            },
        );
        assert_eq!(
            run(&confirm(expired.expose()), true, NOW, &mut ledger),
            Err(Refusal::Expired)
        );
        let steps = [
            (bad.clone(), Refusal::WrongTenant),
            (
                Claims {
                    tenant: "conn-1".into(),
                    ..bad.clone()
                },
                Refusal::WrongTool,
            ),
            (
                Claims {
                    tenant: "conn-1".into(),
                    tool: "execute".into(),
                    ..bad.clone()
                },
                Refusal::WrongTarget,
            ),
            (
                Claims {
                    tenant: "conn-1".into(),
                    tool: "execute".into(),
                    target: "main.db".into(),
                    ..bad.clone()
                },
                Refusal::PlanChanged,
            ),
        ];
        for (claims, expected) in steps {
            let t = mint(&key(), &claims);
            assert_eq!(
                run(&confirm(t.expose()), true, NOW, &mut ledger),
                Err(expected)
            );
        }
        assert_eq!(ledger.calls, 0);
    }

    #[test]
    fn rejection_after_the_signature_carries_the_claims_for_history() {
        let t = token_text();
        let mut ledger = CountingLedger::default();
        verify(&key(), &confirm(&t), true, NOW, &mut ledger).unwrap();
        let rejected = verify(&key(), &confirm(&t), true, NOW, &mut ledger).unwrap_err();
        assert_eq!(rejected.refusal, Refusal::AlreadyUsed);
        assert_eq!(rejected.claims.unwrap().nonce, claims().nonce);
        let rejected = verify(&key(), &confirm("junk"), true, NOW, &mut ledger).unwrap_err();
        assert_eq!(rejected.claims, None);
    }
}
