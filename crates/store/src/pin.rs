//! Pinned tool definitions: what each server's tools looked like when the desk first saw them.
//!
//! An upstream decides what its tools say about themselves (description, schemas, annotations),
//! and an agent reads that text and acts on it. A tool that quietly changes its description after
//! the person started trusting the server can carry an injection, and one that changes its
//! annotations can change its gate class. So the desk keeps, per server identity and tool name,
//! the definition it first saw and its canonical hash; a later listing that differs is held back
//! until the person accepts the difference, and only then is the pin replaced. The pins live in
//! the file, not in memory, so a restart of the desk does not forget them.
//!
//! What is stored is bounded: server and tool names as history caps them (a cut name can only
//! collide with another cut name, and a collision makes the tools differ from the pin, which
//! holds them back: the safe direction), the definition text to [`MAX_DEFINITION_CHARS`] (the
//! hash always covers the whole definition), and the table to [`MAX_PINS`] rows.

use countersign_core::PlanHash;
use rusqlite::{OptionalExtension, TransactionBehavior};

use crate::error::{ms_from_sql, ms_to_sql};
use crate::history::capped;
use crate::{Store, StoreError};

pub(crate) const TABLE: &str = "tool_pin";

/// The most characters of a definition's text kept with its pin (the text is what the person is
/// shown as "before"; the hash is what is compared).
pub const MAX_DEFINITION_CHARS: usize = 64 * 1024;

/// How many pins [`Store::prune`] keeps: the most recently pinned (and every pin of a
/// registered server).
pub const MAX_PINS: i64 = 100_000;

/// The most tools of one server pinned at first sight; a listing with more has the rest held
/// back as new tools (a server with that many is a flood, not a toolbox).
pub const MAX_PINS_PER_SERVER: usize = 1024;

/// One tool's definition as the desk pinned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPin {
    /// The server identity the tool belongs to (a registered name, `builtin:<path>`, a URL, an
    /// ad-hoc command line).
    pub server: String,
    /// The tool's name.
    pub tool: String,
    /// The canonical hash of the definition.
    pub hash: PlanHash,
    /// The definition as the person reads it (sorted, pretty-printed JSON), cut to
    /// [`MAX_DEFINITION_CHARS`].
    pub definition: String,
    /// When it was pinned, ms since the epoch.
    pub pinned_at_ms: u64,
}

/// `text` cut to `max` characters, with a marker saying how much was cut.
pub(crate) fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => std::borrow::Cow::Borrowed(text),
        Some((end, _)) => {
            let rest = text[end..].chars().count();
            std::borrow::Cow::Owned(format!("{}… [cut: {rest} more characters]", &text[..end]))
        }
    }
}

fn read_pin(
    conn: &rusqlite::Connection,
    server: &str,
    tool: &str,
) -> Result<Option<ToolPin>, StoreError> {
    let row = conn
        .prepare_cached(
            "SELECT hash, definition, pinned_at_ms FROM tool_pin WHERE server = ?1 AND tool = ?2",
        )?
        .query_row([server, tool], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .optional()?;
    row.map(|(hash, definition, pinned_at)| decode(server, tool, &hash, definition, pinned_at))
        .transpose()
}

/// The pin of `server`'s `tool` from its stored columns (both stores read these).
pub(crate) fn decode(
    server: &str,
    tool: &str,
    hash: &str,
    definition: String,
    pinned_at: i64,
) -> Result<ToolPin, StoreError> {
    let hash = PlanHash::from_hex(hash).ok_or_else(|| StoreError::InvalidRow {
        table: TABLE,
        reason: format!("hash {hash:?}"),
    })?;
    Ok(ToolPin {
        server: server.to_owned(),
        tool: tool.to_owned(),
        hash,
        definition,
        pinned_at_ms: ms_from_sql(pinned_at, TABLE)?,
    })
}

impl Store {
    /// The pins in force for `candidates` (in their order), pinning those that have none yet as
    /// given, at first sight of their server: a server that has pins already gets no new ones
    /// here (a tool it adds later is a change the person accepts, pinned by [`Store::repin`]),
    /// so the result may hold fewer pins than `candidates`. An existing pin is never replaced
    /// here, so of two listings racing to pin the same tool the first wins and the other is
    /// compared with it.
    pub fn pin_first_seen(&mut self, candidates: &[ToolPin]) -> Result<Vec<ToolPin>, StoreError> {
        let keys: Vec<(String, String)> = candidates
            .iter()
            .map(|c| (capped(&c.server).into_owned(), capped(&c.tool).into_owned()))
            .collect();
        let times = candidates
            .iter()
            .map(|c| ms_to_sql(c.pinned_at_ms))
            .collect::<Result<Vec<_>, _>>()?;
        self.with_connection(|conn| {
            // Most listings find every tool pinned: read without taking the write lock.
            let mut found = Vec::with_capacity(candidates.len());
            for (server, tool) in &keys {
                found.push(read_pin(conn, server, tool)?);
            }
            if found.iter().all(Option::is_some) {
                return Ok(found.into_iter().flatten().collect());
            }
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            // Whether each server was known before this listing: read once, before any insert.
            let mut known = std::collections::HashMap::<&str, bool>::new();
            for (server, _) in &keys {
                if !known.contains_key(server.as_str()) {
                    let seen: bool = tx
                        .prepare_cached("SELECT EXISTS (SELECT 1 FROM tool_pin WHERE server = ?1)")?
                        .query_row([server], |r| r.get(0))?;
                    known.insert(server, seen);
                }
            }
            let mut pins = Vec::with_capacity(candidates.len());
            let mut pinned_now = std::collections::HashMap::<&str, usize>::new();
            for ((candidate, (server, tool)), at) in candidates.iter().zip(&keys).zip(&times) {
                let count = pinned_now.entry(server.as_str()).or_default();
                if known[server.as_str()] || *count >= MAX_PINS_PER_SERVER {
                    if let Some(pin) = read_pin(&tx, server, tool)? {
                        pins.push(pin);
                    }
                    continue;
                }
                tx.prepare_cached(
                    "INSERT INTO tool_pin (server, tool, hash, definition, pinned_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (server, tool) DO NOTHING",
                )?
                .execute(rusqlite::params![
                    server,
                    tool,
                    candidate.hash.to_hex(),
                    cut(&candidate.definition, MAX_DEFINITION_CHARS),
                    at,
                ])?;
                let pin = read_pin(&tx, server, tool)?.ok_or_else(|| StoreError::InvalidRow {
                    table: TABLE,
                    reason: "a pin just written is not there".into(),
                })?;
                pins.push(pin);
                *count += 1;
            }
            tx.commit()?;
            Ok(pins)
        })
    }

    /// Replaces the pin of `pin.server`'s `pin.tool` (the person accepted a changed definition).
    pub fn repin(&mut self, pin: &ToolPin) -> Result<(), StoreError> {
        let at = ms_to_sql(pin.pinned_at_ms)?;
        self.with_connection(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.prepare_cached(
                "INSERT INTO tool_pin (server, tool, hash, definition, pinned_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (server, tool) DO UPDATE
                     SET hash = excluded.hash, definition = excluded.definition,
                         pinned_at_ms = excluded.pinned_at_ms",
            )?
            .execute(rusqlite::params![
                capped(&pin.server),
                capped(&pin.tool),
                pin.hash.to_hex(),
                cut(&pin.definition, MAX_DEFINITION_CHARS),
                at,
            ])?;
            tx.commit()?;
            Ok(())
        })
    }

    /// The pin of `server`'s `tool`, if there is one.
    pub fn tool_pin(&mut self, server: &str, tool: &str) -> Result<Option<ToolPin>, StoreError> {
        let (server, tool) = (capped(server), capped(tool));
        self.with_connection(|conn| read_pin(conn, &server, &tool))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreOptions;
    use crate::test_support::{pin, temp_store};

    #[test]
    fn an_accepted_change_replaces_the_pin_and_survives_a_reopen() {
        let (dir, mut store) = temp_store();
        store.pin_first_seen(&[pin("s", "a", 1, 10)]).unwrap();
        store.repin(&pin("s", "a", 2, 20)).unwrap();
        drop(store);
        let mut store =
            Store::open(dir.path().join("countersign.db"), StoreOptions::default()).unwrap();
        assert_eq!(
            store.tool_pin("s", "a").unwrap(),
            Some(pin("s", "a", 2, 20))
        );
        assert_eq!(store.tool_pin("s", "b").unwrap(), None);
    }

    #[test]
    fn pruning_never_drops_a_registered_servers_pins() {
        let (_dir, mut store) = temp_store();
        store
            .pin_first_seen(&[pin("server:github", "create_issue", 1, 1)])
            .unwrap();
        // Newer pins of identities an agent chose, past what pruning keeps.
        let many: Vec<ToolPin> = (0..MAX_PINS as usize / MAX_PINS_PER_SERVER + 1)
            .flat_map(|s| {
                (0..MAX_PINS_PER_SERVER)
                    .map(move |t| pin(&format!("https://e.example/{s}"), &format!("t{t}"), 1, 2))
            })
            .collect();
        for chunk in many.chunks(MAX_PINS_PER_SERVER) {
            store.pin_first_seen(chunk).unwrap();
        }
        let pruned = store.prune(0).unwrap();
        assert!(pruned.pins > 0);
        assert!(
            store
                .tool_pin("server:github", "create_issue")
                .unwrap()
                .is_some()
        );
    }
}
