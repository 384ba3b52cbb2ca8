//! The contract a single-use token is spent against.
//!
//! Spending is one atomic "insert this nonce" whose duplicate IS the replay signal: there is no
//! read-then-write, because that leaves a window in which two callers both see "not spent". Any
//! other failure means the ledger cannot vouch for the spend, and the caller must fail closed.
//! The durable implementation is SQLite (`countersign-store`); [`MemoryLedger`] is the in-process
//! one used by unit tests.

use std::collections::HashMap;

use crate::token::Nonce;

/// Why a spend did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpendError {
    /// The nonce was spent before: this is a replay.
    #[error("the nonce was already spent")]
    AlreadySpent,
    /// The ledger could not record the spend (unreadable, locked past its timeout, full, ...).
    /// Nothing was spent; the caller must refuse, never proceed.
    #[error("the ledger is unreachable: {0}")]
    Unreachable(String),
}

/// Where single-use nonces are spent.
pub trait Ledger {
    /// Records `nonce` as spent, durably, before the action it guards runs.
    ///
    /// `expires_at_ms` is the token's expiry: after it the row may be pruned, since an expired
    /// token is refused before the ledger is ever asked.
    fn spend(&mut self, nonce: &Nonce, expires_at_ms: u64) -> Result<(), SpendError>;
}

/// A ledger in a map: correct for one process, and the test double for the durable one.
#[derive(Debug, Default)]
pub struct MemoryLedger {
    spent: HashMap<Nonce, u64>,
}

impl MemoryLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many nonces are recorded.
    pub fn len(&self) -> usize {
        self.spent.len()
    }

    /// Whether no nonce is recorded.
    pub fn is_empty(&self) -> bool {
        self.spent.is_empty()
    }

    /// Forgets nonces whose tokens expired before `now_ms`.
    pub fn prune(&mut self, now_ms: u64) {
        self.spent.retain(|_, expires| *expires > now_ms);
    }
}

impl Ledger for MemoryLedger {
    fn spend(&mut self, nonce: &Nonce, expires_at_ms: u64) -> Result<(), SpendError> {
        use std::collections::hash_map::Entry;
        match self.spent.entry(*nonce) {
            Entry::Occupied(_) => Err(SpendError::AlreadySpent),
            Entry::Vacant(slot) => {
                slot.insert(expires_at_ms);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_spend_of_a_nonce_is_already_spent() {
        let mut ledger = MemoryLedger::new();
        let nonce = Nonce::from_bytes([7; 16]);
        assert_eq!(ledger.spend(&nonce, 10), Ok(()));
        assert_eq!(ledger.spend(&nonce, 10), Err(SpendError::AlreadySpent));
        assert_eq!(ledger.len(), 1);
    }

    #[test]
    fn prune_forgets_only_expired_nonces() {
        let mut ledger = MemoryLedger::new();
        ledger.spend(&Nonce::from_bytes([1; 16]), 10).unwrap();
        ledger.spend(&Nonce::from_bytes([2; 16]), 30).unwrap();
        ledger.prune(20);
        assert_eq!(ledger.len(), 1);
        assert_eq!(
            ledger.spend(&Nonce::from_bytes([2; 16]), 30),
            Err(SpendError::AlreadySpent)
        );
    }
}
