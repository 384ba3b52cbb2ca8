//! The history as a chain nobody can quietly edit, and the check that names where it breaks.
//!
//! History is rows in a database file (the desk's SQLite, `serve`'s PostgreSQL): anyone who can
//! write the file can edit or delete a row. So every event is stored with the hash of the one
//! before it and its own hash over both ([`Link`]), and the newest hash is signed with a key of the
//! authority ([`ChainKey`]: Ed25519; on a desk the private half is in the OS keychain, on a team's
//! server it is derived from the confirm secret). Editing a row changes its hash; deleting one
//! leaves a gap in the numbers; moving one puts its number out of order; re-hashing the rest
//! after an edit needs the key to sign the new head. What the chain cannot show alone is a tail
//! cut off together with the head re-signed by someone who holds the key, or an old head put
//! back: a head kept elsewhere (exported, or sent to a collector) catches that ([`Walk::expect`]).
//!
//! Everything here is pure: the stores compute links as they insert, and [`Walk`] checks rows
//! handed to it one at a time, from a database or an export, so a year of history is never held in
//! memory.

use std::fmt;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde_json::json;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::canonical;
use crate::token::{hex_lower, parse_hex};

/// What precedes every hashed event: a hash of anything else is not a link of this chain.
pub const LINK_DOMAIN: &str = "countersign history link v1\n";

/// What precedes every signed head: a signature over anything else is not a head.
pub const HEAD_DOMAIN: &str = "countersign history head v1\n";

/// The label a team's server derives its chain key from its confirm secret with.
pub const SECRET_LABEL: &[u8] = b"countersign history chain key v1";

/// A link's hash: SHA-256 of [`LINK_DOMAIN`] and the link as RFC 8785 canonical JSON.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChainHash([u8; 32]);

impl ChainHash {
    /// What the first event of a chain names as the one before it: 32 zero bytes.
    pub const GENESIS: ChainHash = ChainHash([0; 32]);

    /// Wraps a digest.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex_lower(&self.0)
    }

    /// Parses exactly 64 lowercase hex characters.
    pub fn from_hex(text: &str) -> Option<Self> {
        parse_hex::<32>(text).map(Self)
    }
}

impl fmt::Debug for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChainHash({})", self.to_hex())
    }
}

impl fmt::Display for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// One event as the chain binds it: exactly the values a store keeps in its columns (texts as
/// stored, after any cut), its number in the chain, and the hash of the event before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link<'a> {
    /// Its number: the first event is 1, and each next one is one more.
    pub seq: u64,
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// The kind's code (`issued`, `refused`...).
    pub kind: &'a str,
    /// The refusal's or rejection's code, for the kinds that have one.
    pub refusal: Option<&'a str>,
    /// An execution's outcome.
    pub ok: Option<bool>,
    /// The tool.
    pub tool: &'a str,
    /// The target.
    pub target: Option<&'a str>,
    /// The tenant.
    pub tenant: &'a str,
    /// The nonce, in hex.
    pub nonce: Option<&'a str>,
    /// The plan hash, in hex.
    pub plan: Option<&'a str>,
    /// The note.
    pub note: Option<&'a str>,
    /// The hash of the event before ([`ChainHash::GENESIS`] for the first).
    pub prev: ChainHash,
}

impl Link<'_> {
    /// This link's hash. Numbers are written as decimal strings, so every `u64` hashes exactly
    /// (JSON numbers beyond 2^53 are not exact everywhere).
    pub fn hash(&self) -> ChainHash {
        let value = json!({
            "seq": self.seq.to_string(),
            "atMs": self.at_ms.to_string(),
            "kind": self.kind,
            "refusal": self.refusal,
            "ok": self.ok,
            "tool": self.tool,
            "target": self.target,
            "tenant": self.tenant,
            "nonce": self.nonce,
            "plan": self.plan,
            "note": self.note,
            "prev": self.prev.to_hex(),
        });
        // Strings, booleans and nulls in a fixed shape: always canonical.
        let text = canonical::to_string(&value).unwrap_or_default();
        let mut digest = Sha256::new();
        digest.update(LINK_DOMAIN.as_bytes());
        digest.update(text.as_bytes());
        ChainHash(digest.finalize().into())
    }
}

/// A point of the chain: the event numbered `seq` has the hash `hash`. Signed, the newest one is
/// the chain's head; the one just before the oldest kept event marks where a pruned chain starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The event's number (0 with [`ChainHash::GENESIS`]: before the first event).
    pub seq: u64,
    /// The event's hash.
    pub hash: ChainHash,
    /// When it was signed, ms since the epoch.
    pub at_ms: u64,
}

impl Head {
    /// The bytes signed: [`HEAD_DOMAIN`], then the head as RFC 8785 canonical JSON.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let value = json!({
            "seq": self.seq.to_string(),
            "hash": self.hash.to_hex(),
            "atMs": self.at_ms.to_string(),
        });
        let text = canonical::to_string(&value).unwrap_or_default();
        [HEAD_DOMAIN.as_bytes(), text.as_bytes()].concat()
    }
}

/// The authority's key that signs the chain's head.
pub struct ChainKey(SigningKey);

impl fmt::Debug for ChainKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ChainKey")
            .field(&self.public_text())
            .finish()
    }
}

/// Two keys are the same key when their public halves are.
impl PartialEq for ChainKey {
    fn eq(&self, other: &Self) -> bool {
        self.public() == other.public()
    }
}

impl Eq for ChainKey {}

impl ChainKey {
    /// The key pair of the 32 secret bytes `seed` (from the desk's keychain, or fresh random bytes).
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        ChainKey(SigningKey::from_bytes(seed))
    }

    /// The key a team's server signs with: derived from its confirm secret (the secret every
    /// replica shares), under [`SECRET_LABEL`], so the token key itself never signs anything else.
    pub fn from_secret(secret: &crate::token::SigningKey) -> Self {
        let seed = secret.derived_bytes(SECRET_LABEL);
        ChainKey::from_seed(&seed)
    }

    /// The secret bytes, for the keychain.
    pub fn seed(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(self.0.to_bytes())
    }

    /// The public half, which a person exports and keeps to check the chain with.
    pub fn public(&self) -> [u8; 32] {
        self.0.verifying_key().to_bytes()
    }

    /// The public half as people copy it (`ed25519:…`).
    pub fn public_text(&self) -> String {
        crate::approver::public_key_text(&self.public())
    }

    /// `head`, signed.
    pub fn sign(&self, head: Head) -> SignedHead {
        SignedHead {
            head,
            key: self.public(),
            signature: self.0.sign(&head.signed_bytes()).to_bytes(),
        }
    }
}

/// A head with its signature and the public key it names. The key named is only a claim: a
/// check that matters is made against a key the person kept ([`SignedHead::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignedHead {
    /// What is signed.
    pub head: Head,
    /// The public key that signed it, as the head says.
    pub key: [u8; 32],
    /// The Ed25519 signature over [`Head::signed_bytes`].
    pub signature: [u8; 64],
}

impl SignedHead {
    /// Whether the signature is `key`'s over this head (or, with no key given, the key the head
    /// names). Strict verification: a malleable signature or a weak key is refused.
    pub fn check(&self, key: Option<&[u8; 32]>) -> Result<(), Break> {
        let public = key.unwrap_or(&self.key);
        if public != &self.key {
            return Err(Break::WrongKey {
                seq: self.head.seq,
                named: self.key,
            });
        }
        let forged = Break::ForgedHead { seq: self.head.seq };
        let verifying = VerifyingKey::from_bytes(public).map_err(|_| forged.clone())?;
        if verifying.is_weak() {
            return Err(forged);
        }
        verifying
            .verify_strict(
                &self.head.signed_bytes(),
                &Signature::from_bytes(&self.signature),
            )
            .map_err(|_| forged)
    }

    /// The head as one JSON object: what an export ends with and `countersign history head`
    /// prints.
    pub fn to_json(&self) -> serde_json::Value {
        use base64::Engine as _;
        json!({
            "seq": self.head.seq,
            "hash": self.head.hash.to_hex(),
            "atMs": self.head.at_ms,
            "key": crate::approver::public_key_text(&self.key),
            "signature": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.signature),
        })
    }

    /// The head [`SignedHead::to_json`] wrote, if `value` is exactly one.
    pub fn from_json(value: &serde_json::Value) -> Option<SignedHead> {
        use base64::Engine as _;
        let object = value.as_object()?;
        if object.len() != 5 {
            return None;
        }
        let signature = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(object.get("signature")?.as_str()?)
            .ok()?;
        Some(SignedHead {
            head: Head {
                seq: object.get("seq")?.as_u64()?,
                hash: ChainHash::from_hex(object.get("hash")?.as_str()?)?,
                at_ms: object.get("atMs")?.as_u64()?,
            },
            key: crate::approver::parse_public_key(object.get("key")?.as_str()?)?,
            signature: signature.try_into().ok()?,
        })
    }
}

/// Where, and how, a chain stops being the one that was signed. Each names the first event (by
/// its number) at which the check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Break {
    /// The event's contents no longer hash to the hash stored with it: it was edited.
    #[error("event #{seq} was edited: its contents no longer match its hash")]
    Edited {
        /// The event.
        seq: u64,
    },
    /// The event does not name the hash of the one before it: that one was edited and re-hashed,
    /// or this one was put in from elsewhere.
    #[error(
        "event #{seq} does not follow event #{after}: #{after} was changed (and re-hashed) or #{seq} put in its place"
    )]
    Unlinked {
        /// The event that names another hash.
        seq: u64,
        /// The event before it.
        after: u64,
    },
    /// Events are missing between two that are there: deleted.
    #[error("events #{from} to #{to} are missing: deleted")]
    Missing {
        /// The first missing number.
        from: u64,
        /// The last missing number.
        to: u64,
    },
    /// An event comes after one with a number not below its own: moved.
    #[error("event #{seq} comes after event #{after}: the events were reordered")]
    Reordered {
        /// The event out of place.
        seq: u64,
        /// The one it follows.
        after: u64,
    },
    /// The first event is numbered 1 but does not start from nothing.
    #[error("event #1 does not start the chain")]
    BadStart,
    /// The oldest event is not the first, and no signed mark says the ones before were pruned.
    #[error(
        "the history begins at event #{seq} and nothing signed says the events before it were pruned: deleted"
    )]
    UnmarkedStart {
        /// The oldest event there.
        seq: u64,
    },
    /// A head's signature is not valid: it was forged or altered.
    #[error("the head at event #{seq} is not validly signed: forged")]
    ForgedHead {
        /// The head's event.
        seq: u64,
    },
    /// A head names another key than the one given to check with.
    #[error("the head at event #{seq} is signed by another key than the one given")]
    WrongKey {
        /// The head's event.
        seq: u64,
        /// The key it names.
        named: [u8; 32],
    },
    /// A signed head's hash differs from the event it names: the chain was rewritten under it.
    #[error("event #{seq} is not the event its signed head names: the chain was rewritten")]
    NotTheHead {
        /// The event.
        seq: u64,
    },
    /// A signed head names an event beyond the last one there: the tail was cut off.
    #[error(
        "the history ends at event #{last} but event #{head} was seen before (under a signed head, or at a collector): the events after #{last} were cut off"
    )]
    TailCut {
        /// The last event there.
        last: u64,
        /// The event the head names.
        head: u64,
    },
    /// Events after the newest signed head: nothing signed covers them.
    #[error(
        "events from #{from} on are not covered by a signed head (written without the key, or added)"
    )]
    Unsigned {
        /// The first event not covered.
        from: u64,
    },
    /// Nothing signed covers the events at all.
    #[error("no signed head covers these events: give one with --head")]
    NoHead,
    /// A row or a line is not an event as stored (a value of the wrong type or form).
    #[error("{at} is not an event as it was stored: {reason}")]
    Unreadable {
        /// Where (an event number, or a line).
        at: String,
        /// What is wrong.
        reason: String,
    },
}

impl Break {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            Break::Edited { .. } => "edited",
            Break::Unlinked { .. } => "unlinked",
            Break::Missing { .. } => "missing",
            Break::Reordered { .. } => "reordered",
            Break::BadStart => "bad_start",
            Break::UnmarkedStart { .. } => "unmarked_start",
            Break::ForgedHead { .. } => "forged_head",
            Break::WrongKey { .. } => "wrong_key",
            Break::NotTheHead { .. } => "not_the_head",
            Break::TailCut { .. } => "tail_cut",
            Break::Unsigned { .. } => "unsigned",
            Break::NoHead => "no_head",
            Break::Unreadable { .. } => "unreadable",
        }
    }
}

/// A check of a chain, one event at a time, oldest first.
///
/// Give it the heads to hold the chain to ([`Walk::expect`]: heads signed earlier, kept by the
/// person or a collector), hand it every event ([`Walk::step`]), then [`Walk::finish`] with the
/// head the source itself carries and, if the chain does not start at #1, the signed mark of where
/// it starts.
#[derive(Debug, Default)]
pub struct Walk {
    key: Option<[u8; 32]>,
    /// The first event's number and the hash it names before it.
    first: Option<(u64, ChainHash)>,
    /// The last event's number and hash.
    last: Option<(u64, ChainHash)>,
    expected: Vec<SignedHead>,
    /// Events seen elsewhere (a collector's records): number and hash, unsigned.
    seen: Vec<(u64, ChainHash)>,
    /// A gap just seen: missing events, unless the next event is one of them (then reordered).
    gap: Option<(u64, u64, u64)>,
}

/// What a chain that holds is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intact {
    /// The oldest event's number (none when there are no events).
    pub first: Option<u64>,
    /// The newest event's number.
    pub last: Option<u64>,
    /// The head the chain ends at, checked.
    pub head: Option<SignedHead>,
    /// Whether the chain starts at a signed prune mark rather than at #1.
    pub pruned_before: bool,
}

impl Walk {
    /// A check of signatures against `key` (the authority's public key, as the person exported
    /// it); with none, against the key each head names, which proves only that the chain is
    /// whole under that key.
    pub fn new(key: Option<[u8; 32]>) -> Self {
        Walk {
            key,
            ..Walk::default()
        }
    }

    /// Holds the chain to `head`, signed earlier: the event it names must be there, with that
    /// hash. A head whose signature fails is refused at once.
    pub fn expect(&mut self, head: SignedHead) -> Result<(), Break> {
        head.check(self.key.as_ref())?;
        self.expected.push(head);
        Ok(())
    }

    /// Holds the chain to an event seen elsewhere, unsigned: event `seq` with hash `hash`, as a
    /// collector received it (`countersign.seq`, `countersign.chain.hash`). The event must be
    /// there, with that hash: a tail cut off after the collector saw it is named.
    pub fn expect_seen(&mut self, seq: u64, hash: ChainHash) {
        self.seen.push((seq, hash));
    }

    /// Checks the next event, whose stored hash is `stored`.
    pub fn step(&mut self, link: &Link<'_>, stored: ChainHash) -> Result<(), Break> {
        let seq = link.seq;
        if let Some((from, to, after)) = self.gap.take() {
            return Err(if (from..=to).contains(&seq) {
                Break::Reordered { seq, after }
            } else {
                Break::Missing { from, to }
            });
        }
        if let Some((last, hash)) = self.last {
            if seq <= last {
                return Err(Break::Reordered { seq, after: last });
            }
            if seq > last + 1 {
                // Missing, or moved further down: the next event tells which.
                self.gap = Some((last + 1, seq - 1, seq));
                return Ok(());
            }
            if link.hash() != stored {
                return Err(Break::Edited { seq });
            }
            if link.prev != hash {
                return Err(Break::Unlinked { seq, after: last });
            }
        } else {
            if link.hash() != stored {
                return Err(Break::Edited { seq });
            }
            if seq == 0 || (seq == 1 && link.prev != ChainHash::GENESIS) {
                return Err(Break::BadStart);
            }
            self.first = Some((seq, link.prev));
        }
        let points = self.expected.iter().map(|h| (h.head.seq, h.head.hash));
        for (at, hash) in points.chain(self.seen.iter().copied()) {
            if at == seq && hash != stored {
                return Err(Break::NotTheHead { seq });
            }
        }
        self.last = Some((seq, stored));
        Ok(())
    }

    /// The verdict once every event was handed over. `head`: the signed head the source carries
    /// (a database's, an export's last line), if any; `start`: where a chain that does not begin
    /// at #1 is signed to begin (a database's prune mark), if any; `slice`: whether the source may
    /// begin anywhere (an export bounded by `--since`), so that a later start is no break.
    pub fn finish(
        self,
        head: Option<SignedHead>,
        start: Option<SignedHead>,
        slice: bool,
    ) -> Result<Intact, Break> {
        if let Some((from, to, _)) = self.gap {
            return Err(Break::Missing { from, to });
        }
        let mut pruned_before = false;
        if let Some((first, prev)) = self.first
            && first > 1
            && !slice
        {
            let marked = start.is_some_and(|mark| {
                mark.head.seq + 1 == first
                    && mark.head.hash == prev
                    && mark.check(self.key.as_ref()).is_ok()
            });
            if !marked {
                return Err(Break::UnmarkedStart { seq: first });
            }
            pruned_before = true;
        }
        let last = self.last.map(|(seq, _)| seq);
        // A head kept elsewhere, or an event seen elsewhere, past the end: the tail was cut.
        let points = self.expected.iter().map(|h| h.head.seq);
        for kept in points.chain(self.seen.iter().map(|(seq, _)| *seq)) {
            match last {
                Some(last) if kept <= last => {}
                _ if kept == 0 => {}
                _ => {
                    return Err(Break::TailCut {
                        last: last.unwrap_or(0),
                        head: kept,
                    });
                }
            }
        }
        if let Some(head) = head {
            head.check(self.key.as_ref())?;
            match self.last {
                None if head.head.seq == 0 => {}
                None => {
                    return Err(Break::TailCut {
                        last: 0,
                        head: head.head.seq,
                    });
                }
                Some((last, hash)) => {
                    if head.head.seq > last {
                        return Err(Break::TailCut {
                            last,
                            head: head.head.seq,
                        });
                    }
                    if head.head.seq < last {
                        return Err(Break::Unsigned {
                            from: head.head.seq + 1,
                        });
                    }
                    if head.head.hash != hash {
                        return Err(Break::NotTheHead { seq: last });
                    }
                }
            }
            return Ok(Intact {
                first: self.first.map(|(seq, _)| seq),
                last,
                head: Some(head),
                pruned_before,
            });
        }
        // No head of its own: the newest head kept elsewhere must be the last event.
        let newest = self.expected.iter().max_by_key(|h| h.head.seq).copied();
        match (last, newest) {
            (None, _) => Ok(Intact {
                first: None,
                last: None,
                head: newest,
                pruned_before,
            }),
            (Some(last), Some(kept)) if kept.head.seq == last => Ok(Intact {
                first: self.first.map(|(seq, _)| seq),
                last: Some(last),
                head: Some(kept),
                pruned_before,
            }),
            (Some(_), Some(kept)) => Err(Break::Unsigned {
                from: kept.head.seq + 1,
            }),
            (Some(_), None) => Err(Break::NoHead),
        }
    }
}

/// Why a text gives no signed heads ([`heads_in`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeadsError {
    /// A line says it is a head (`{"head": …}`) and is not one.
    #[error("line {line}: not a signed head")]
    NotAHead {
        /// The line's number, counted from 1.
        line: usize,
    },
    /// No line of the text holds a signed head.
    #[error("holds no signed head")]
    NoHead,
}

/// Every signed head in `text` (`{"head": …}` lines: what `countersign history head` prints and
/// what an export ends with), in order; other lines are passed over. `Err` names the first line
/// that says it is a head and is not one, or says there is none.
pub fn heads_in(text: &str) -> Result<Vec<SignedHead>, HeadsError> {
    let mut heads = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let Some(head) = value.get("head") {
            heads.push(SignedHead::from_json(head).ok_or(HeadsError::NotAHead { line: i + 1 })?);
        }
    }
    if heads.is_empty() {
        return Err(HeadsError::NoHead);
    }
    Ok(heads)
}

/// Why a `--seen` point is not an event seen elsewhere ([`seen_in`]). Each names the text given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SeenError {
    /// The text has no `:` between an event number and a hash.
    #[error("--seen {text:?} is not SEQ:HASH")]
    NotSeqHash {
        /// The text given.
        text: String,
    },
    /// What comes before the `:` is not an event number.
    #[error("--seen {text:?}: {seq:?} is not an event number")]
    NotASeq {
        /// The text given.
        text: String,
        /// What stands where the event number should.
        seq: String,
        /// Why it does not parse as one.
        #[source]
        source: std::num::ParseIntError,
    },
    /// What comes after the `:` is not a chain hash (64 lowercase hex digits).
    #[error("--seen {text:?}: {hash:?} is not a chain hash")]
    NotAHash {
        /// The text given.
        text: String,
        /// What stands where the hash should.
        hash: String,
    },
}

/// An event seen elsewhere, written `SEQ:HASH` (a collector's `countersign.seq` and
/// `countersign.chain.hash`), for [`Walk::expect_seen`].
pub fn seen_in(text: &str) -> Result<(u64, ChainHash), SeenError> {
    let (seq, hash) = text.split_once(':').ok_or_else(|| SeenError::NotSeqHash {
        text: text.to_owned(),
    })?;
    let seq = seq.trim().parse().map_err(|source| SeenError::NotASeq {
        text: text.to_owned(),
        seq: seq.to_owned(),
        source,
    })?;
    let hash = ChainHash::from_hex(hash.trim()).ok_or_else(|| SeenError::NotAHash {
        text: text.to_owned(),
        hash: hash.to_owned(),
    })?;
    Ok((seq, hash))
}

/// What a check found, in one line for people: `history intact: …` with the range, the head and
/// its key (and, when no key was given to check with, that the key is only the one the history
/// names), or `history broken (CODE): …` naming the first event that breaks.
pub fn describe(result: &Result<Intact, Break>, key_given: bool) -> String {
    match result {
        Ok(intact) => {
            let range = match (intact.first, intact.last) {
                (Some(first), Some(last)) => format!("events #{first} to #{last}"),
                _ => "no events".to_owned(),
            };
            let pruned = if intact.pruned_before {
                " (older events were pruned, as signed)"
            } else {
                ""
            };
            let signer = match intact.head {
                Some(head) => {
                    let key = crate::approver::public_key_text(&head.key);
                    let caveat = if key_given {
                        ""
                    } else {
                        " (the key the history names: pass --key with the authority's public \
                         chain key to check it is the authority's)"
                    };
                    format!(
                        ", under the head at #{} signed by {key}{caveat}",
                        head.head.seq
                    )
                }
                None => String::new(),
            };
            format!("history intact: {range}{pruned}{signer}")
        }
        Err(broken) => format!("history broken ({}): {broken}", broken.code()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(seq: u64, prev: ChainHash, target: &str) -> Link<'_> {
        Link {
            seq,
            at_ms: 1_000 + seq,
            kind: "refused",
            refusal: Some("expired"),
            ok: None,
            tool: "execute",
            target: Some(target),
            tenant: "c1",
            nonce: None,
            plan: None,
            note: None,
            prev,
        }
    }

    /// `n` chained events with targets t1..tn: (link values, hashes).
    fn chain(n: u64) -> (Vec<String>, Vec<ChainHash>) {
        let targets: Vec<String> = (1..=n).map(|i| format!("t{i}")).collect();
        let mut hashes = Vec::new();
        let mut prev = ChainHash::GENESIS;
        for (i, t) in targets.iter().enumerate() {
            let h = link(i as u64 + 1, prev, t).hash();
            hashes.push(h);
            prev = h;
        }
        (targets, hashes)
    }

    fn walk_all(walk: &mut Walk, rows: &[(u64, &str, ChainHash, ChainHash)]) -> Result<(), Break> {
        for &(seq, target, prev, stored) in rows {
            walk.step(&link(seq, prev, target), stored)?;
        }
        Ok(())
    }

    fn rows(targets: &[String], hashes: &[ChainHash]) -> Vec<(u64, String, ChainHash, ChainHash)> {
        (0..targets.len())
            .map(|i| {
                let prev = if i == 0 {
                    ChainHash::GENESIS
                } else {
                    hashes[i - 1]
                };
                (i as u64 + 1, targets[i].clone(), prev, hashes[i])
            })
            .collect()
    }

    fn check(
        key: &ChainKey,
        rows: &[(u64, String, ChainHash, ChainHash)],
        head: Option<SignedHead>,
    ) -> Result<Intact, Break> {
        let mut walk = Walk::new(Some(key.public()));
        let borrowed: Vec<_> = rows
            .iter()
            .map(|(s, t, p, h)| (*s, t.as_str(), *p, *h))
            .collect();
        walk_all(&mut walk, &borrowed)?;
        walk.finish(head, None, false)
    }

    #[test]
    fn a_whole_chain_under_its_signed_head_is_intact() {
        let key = ChainKey::from_seed(&[7; 32]);
        let (targets, hashes) = chain(5);
        let head = key.sign(Head {
            seq: 5,
            hash: hashes[4],
            at_ms: 9,
        });
        let intact = check(&key, &rows(&targets, &hashes), Some(head)).unwrap();
        assert_eq!((intact.first, intact.last), (Some(1), Some(5)));
    }

    #[test]
    fn each_change_is_named_at_the_first_event_it_breaks() {
        let key = ChainKey::from_seed(&[7; 32]);
        let (targets, hashes) = chain(5);
        let head = key.sign(Head {
            seq: 5,
            hash: hashes[4],
            at_ms: 9,
        });
        let good = rows(&targets, &hashes);

        let mut edited = good.clone();
        edited[2].1 = "other".into();
        assert_eq!(
            check(&key, &edited, Some(head)),
            Err(Break::Edited { seq: 3 })
        );

        // Edited and re-hashed: the next event no longer follows it.
        let mut rehashed = good.clone();
        rehashed[2].1 = "other".into();
        rehashed[2].3 = link(3, hashes[1], "other").hash();
        assert_eq!(
            check(&key, &rehashed, Some(head)),
            Err(Break::Unlinked { seq: 4, after: 3 })
        );

        let mut deleted = good.clone();
        deleted.remove(1);
        assert_eq!(
            check(&key, &deleted, Some(head)),
            Err(Break::Missing { from: 2, to: 2 })
        );

        let mut reordered = good.clone();
        reordered.swap(2, 3);
        assert_eq!(
            check(&key, &reordered, Some(head)),
            Err(Break::Reordered { seq: 3, after: 4 })
        );
        let mut last_deleted_before_end = good.clone();
        last_deleted_before_end.remove(3);
        assert_eq!(
            check(&key, &last_deleted_before_end, Some(head)),
            Err(Break::Missing { from: 4, to: 4 })
        );
        let mut moved_back = good.clone();
        let fourth = moved_back.remove(3);
        moved_back.push(fourth);
        assert_eq!(
            check(&key, &moved_back, Some(head)),
            Err(Break::Reordered { seq: 4, after: 5 })
        );

        let mut forged = head;
        forged.head.hash = hashes[3];
        assert_eq!(
            check(&key, &good, Some(forged)),
            Err(Break::ForgedHead { seq: 5 })
        );
        let other = ChainKey::from_seed(&[8; 32]).sign(head.head);
        assert!(matches!(
            check(&key, &good, Some(other)),
            Err(Break::WrongKey { seq: 5, .. })
        ));

        let mut cut = good.clone();
        cut.pop();
        assert_eq!(
            check(&key, &cut, Some(head)),
            Err(Break::TailCut { last: 4, head: 5 })
        );
        assert_eq!(check(&key, &good, None), Err(Break::NoHead));
        let older = key.sign(Head {
            seq: 4,
            hash: hashes[3],
            at_ms: 8,
        });
        assert_eq!(
            check(&key, &good, Some(older)),
            Err(Break::Unsigned { from: 5 })
        );
    }

    #[test]
    fn a_head_kept_elsewhere_catches_a_tail_cut_with_the_head_signed_again() {
        // Someone with the key cuts event 5 and signs a head at 4: the chain alone holds, the head
        // kept from before does not.
        let key = ChainKey::from_seed(&[7; 32]);
        let (targets, hashes) = chain(5);
        let kept = key.sign(Head {
            seq: 5,
            hash: hashes[4],
            at_ms: 9,
        });
        let resigned = key.sign(Head {
            seq: 4,
            hash: hashes[3],
            at_ms: 10,
        });
        let mut cut = rows(&targets, &hashes);
        cut.pop();
        assert!(check(&key, &cut, Some(resigned)).is_ok());
        let mut walk = Walk::new(Some(key.public()));
        walk.expect(kept).unwrap();
        let borrowed: Vec<_> = cut
            .iter()
            .map(|(s, t, p, h)| (*s, t.as_str(), *p, *h))
            .collect();
        walk_all(&mut walk, &borrowed).unwrap();
        assert_eq!(
            walk.finish(Some(resigned), None, false),
            Err(Break::TailCut { last: 4, head: 5 })
        );
        // And a kept head whose event was rewritten under it.
        let mut walk = Walk::new(Some(key.public()));
        walk.expect(key.sign(Head {
            seq: 2,
            hash: hashes[0],
            at_ms: 1,
        }))
        .unwrap();
        let all = rows(&targets, &hashes);
        let borrowed: Vec<_> = all
            .iter()
            .map(|(s, t, p, h)| (*s, t.as_str(), *p, *h))
            .collect();
        assert_eq!(
            walk_all(&mut walk, &borrowed),
            Err(Break::NotTheHead { seq: 2 })
        );
    }

    #[test]
    fn an_event_a_collector_saw_catches_a_tail_cut_and_a_rewrite() {
        let key = ChainKey::from_seed(&[7; 32]);
        let (targets, hashes) = chain(5);
        let all = rows(&targets, &hashes);
        let run = |rows: &[(u64, String, ChainHash, ChainHash)], seen: (u64, ChainHash)| {
            let mut walk = Walk::new(Some(key.public()));
            walk.expect_seen(seen.0, seen.1);
            let borrowed: Vec<_> = rows
                .iter()
                .map(|(s, t, p, h)| (*s, t.as_str(), *p, *h))
                .collect();
            walk_all(&mut walk, &borrowed)?;
            let last = rows.last().unwrap();
            walk.finish(
                Some(key.sign(Head {
                    seq: last.0,
                    hash: last.3,
                    at_ms: 9,
                })),
                None,
                false,
            )
        };
        assert!(run(&all, (5, hashes[4])).is_ok());
        assert_eq!(
            run(&all[..3], (5, hashes[4])),
            Err(Break::TailCut { last: 3, head: 5 })
        );
        assert_eq!(run(&all, (4, hashes[0])), Err(Break::NotTheHead { seq: 4 }));
    }

    #[test]
    fn a_pruned_start_holds_only_with_its_signed_mark() {
        let key = ChainKey::from_seed(&[7; 32]);
        let (targets, hashes) = chain(5);
        let tail = rows(&targets, &hashes).split_off(2);
        let borrowed: Vec<_> = tail
            .iter()
            .map(|(s, t, p, h)| (*s, t.as_str(), *p, *h))
            .collect();
        let head = key.sign(Head {
            seq: 5,
            hash: hashes[4],
            at_ms: 9,
        });
        let mark = key.sign(Head {
            seq: 2,
            hash: hashes[1],
            at_ms: 3,
        });
        let run = |start: Option<SignedHead>, slice: bool| {
            let mut walk = Walk::new(Some(key.public()));
            walk_all(&mut walk, &borrowed).unwrap();
            walk.finish(Some(head), start, slice)
        };
        assert!(run(Some(mark), false).unwrap().pruned_before);
        assert_eq!(run(None, false), Err(Break::UnmarkedStart { seq: 3 }));
        let wrong = key.sign(Head {
            seq: 1,
            hash: hashes[0],
            at_ms: 3,
        });
        assert_eq!(
            run(Some(wrong), false),
            Err(Break::UnmarkedStart { seq: 3 })
        );
        assert!(run(None, true).is_ok(), "an export may begin anywhere");
    }

    #[test]
    fn a_signed_head_reads_back_from_its_json_and_nothing_else_does() {
        let key = ChainKey::from_seed(&[7; 32]);
        let head = key.sign(Head {
            seq: 42,
            hash: ChainHash::from_bytes([3; 32]),
            at_ms: 1_796_117_400_000,
        });
        let json = head.to_json();
        assert_eq!(SignedHead::from_json(&json), Some(head));
        assert_eq!(head.check(Some(&key.public())), Ok(()));
        let mut extra = json.clone();
        extra["x"] = json!(1);
        assert_eq!(SignedHead::from_json(&extra), None);
        let mut bad = json;
        bad["hash"] = json!("zz");
        assert_eq!(SignedHead::from_json(&bad), None);
    }

    #[test]
    fn the_key_never_shows_its_secret_half() {
        let key = ChainKey::from_seed(&[7; 32]);
        let debug = format!("{key:?}");
        assert!(debug.contains("ed25519:"), "{debug}");
        assert!(!debug.contains("BwcH"), "{debug}");
    }

    #[test]
    fn a_servers_key_is_its_secrets_and_no_other() {
        let a = crate::token::SigningKey::new(&[1; 32]).unwrap();
        let b = crate::token::SigningKey::new(&[2; 32]).unwrap();
        assert_eq!(ChainKey::from_secret(&a), ChainKey::from_secret(&a));
        assert_ne!(ChainKey::from_secret(&a), ChainKey::from_secret(&b));
    }

    #[test]
    fn every_field_of_an_event_is_bound_by_its_hash() {
        let base = link(1, ChainHash::GENESIS, "t");
        let h = base.hash();
        let variants = [
            Link { seq: 2, ..base },
            Link { at_ms: 0, ..base },
            Link {
                kind: "accepted",
                ..base
            },
            Link {
                refusal: None,
                ..base
            },
            Link {
                ok: Some(true),
                ..base
            },
            Link {
                tool: "other",
                ..base
            },
            Link {
                target: None,
                ..base
            },
            Link {
                target: Some(""),
                ..base
            },
            Link {
                tenant: "c2",
                ..base
            },
            Link {
                nonce: Some("00"),
                ..base
            },
            Link {
                plan: Some("00"),
                ..base
            },
            Link {
                note: Some(""),
                ..base
            },
            Link {
                prev: ChainHash::from_bytes([1; 32]),
                ..base
            },
        ];
        for v in variants {
            assert_ne!(v.hash(), h, "{v:?}");
        }
    }
}
