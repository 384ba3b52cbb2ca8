//! What a change to `policy.cedar` does, said beside its text diff: proved by Cedar's symbolic
//! compiler and a cvc5 process (`CVC5`, or `cvc5` on the path), or said plainly not known.
//!
//! Never "only tightens" without a proof: a solver that is missing, fails or runs out of time,
//! and rules that wait for a tool no server lists, each say so instead.

use std::path::PathBuf;
use std::time::Duration;

#[cfg(feature = "widening")]
use countersign_cedar::{Widening, widening};
use countersign_engine::Engine;

#[cfg(feature = "widening")]
use crate::guard::rules_in;

/// How long the solver may take over one change, in all.
pub const ANALYSIS_LIMIT: Duration = Duration::from_secs(30);

/// The most solver-found examples said in one change's summary (the rest are counted).
#[cfg(feature = "widening")]
const MOST_EXAMPLES: usize = 3;

/// The cvc5 executable: `CVC5`, or `cvc5` on the path.
pub fn solver() -> PathBuf {
    std::env::var_os("CVC5")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("cvc5"))
}

/// One sentence (or a few) saying what changing the rules from `before` to `after` does.
#[cfg(not(feature = "widening"))]
pub async fn what_it_changes(_engine: &Engine, _before: &str, _after: &str) -> String {
    "What it changes is not known (not_analysed: this build has no solver); read the text"
        .to_owned()
}

/// One sentence (or a few) saying what changing the rules from `before` to `after` does.
#[cfg(feature = "widening")]
pub async fn what_it_changes(engine: &Engine, before: &str, after: &str) -> String {
    let load = |text: &str| engine.load_rules(rules_in(text).unwrap_or_default());
    let (old, new) = match (load(before), load(after)) {
        (Ok(old), Ok(new)) => (old, new),
        // The rules in force no longer load against what the servers list: nothing to
        // compare with, so nothing is claimed.
        (Err(e), _) | (_, Err(e)) => {
            return format!(
                "What it changes is not known: the rules cannot be compared ({e}); read the text"
            );
        }
    };
    said(&widening(&old, &new, &solver(), ANALYSIS_LIMIT).await)
}

/// The sentence for `verdict`.
#[cfg(feature = "widening")]
pub fn said(verdict: &Widening) -> String {
    match verdict {
        Widening::OnlyTightens => "Proved by the solver: it only tightens (nothing runs without a \
             click, is let through, needs fewer approvers, or loses works-once or a typed target, \
             that did not before)"
            .to_owned(),
        Widening::Widens(examples) => {
            let mut text = "It widens; calls the solver found: ".to_owned();
            let shown: Vec<String> = examples
                .iter()
                .take(MOST_EXAMPLES)
                .map(|e| e.sentence())
                .collect();
            text.push_str(&shown.join("; "));
            if examples.len() > MOST_EXAMPLES {
                text.push_str(&format!(
                    "; and {} more ways",
                    examples.len() - MOST_EXAMPLES
                ));
            }
            text
        }
        Widening::Unknown(why) => format!(
            "What it changes is not known ({}: {why}): it is not proved to only tighten; read the text",
            why.code()
        ),
    }
}
