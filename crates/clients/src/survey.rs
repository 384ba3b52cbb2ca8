//! Which clients are on this machine, and how far each is protected: what `countersign clients`
//! prints, what `countersign install --all` walks, and what Settings → Clients shows. One
//! function for the three, so they cannot disagree.
//!
//! Reading only: no desk is asked, nothing is written. An entry counts as protected when it
//! already starts `countersign mcp`; one install would register is "to protect"; the rest are
//! left alone, each with its reason and the next move.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{ALL, Client, EntryAt, Leave, Places, plan};

/// What the file of one client says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientState {
    /// There is no configuration at the client's place: the client is not used here (or keeps
    /// its file elsewhere: `--config PATH`).
    NotFound,
    /// The file is there but cannot be read as the client's configuration.
    Unreadable(String),
    /// The file was read.
    Read(Entries),
}

/// The entries of a client's file, by what install would do with each.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Entries {
    /// Entries that already start `countersign mcp`.
    pub protected: Vec<EntryAt>,
    /// Entries install would register in the desk and rewrite.
    pub to_protect: Vec<EntryAt>,
    /// Entries install leaves as they are, why, and what to do.
    pub left: Vec<(EntryAt, Leave)>,
}

impl Entries {
    /// Whether install has nothing left to do here (every server it can take is taken).
    pub fn is_protected(&self) -> bool {
        self.to_protect.is_empty()
    }

    /// How many servers the file has.
    pub fn servers(&self) -> usize {
        self.protected.len() + self.to_protect.len() + self.left.len()
    }
}

/// One client on this machine.
#[derive(Debug, Clone)]
pub struct Surveyed {
    /// The client.
    pub client: Client,
    /// Its user configuration file.
    pub path: PathBuf,
    /// What that file says.
    pub state: ClientState,
}

/// Every client, in the order of [`ALL`], with what its user configuration says now.
pub fn survey(places: &Places) -> Vec<Surveyed> {
    ALL.into_iter()
        .map(|client| {
            let path = client.user_config(places);
            let state = state_of(client, &path);
            Surveyed {
                client,
                path,
                state,
            }
        })
        .collect()
}

fn state_of(client: Client, path: &std::path::Path) -> ClientState {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return ClientState::NotFound,
        Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => return ClientState::NotFound,
        Err(e) => return ClientState::Unreadable(format!("cannot read it: {e}")),
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return ClientState::Unreadable("it is not UTF-8".into());
    };
    // The names install would give do not matter here: an empty registry and any program.
    match plan(client, &text, &BTreeMap::new(), "countersign") {
        Ok(plan) => ClientState::Read(Entries {
            protected: plan.wrapped,
            to_protect: plan.registrations.into_iter().map(|r| r.at).collect(),
            left: plan.left,
        }),
        Err(e) => ClientState::Unreadable(e.to_string()),
    }
}
