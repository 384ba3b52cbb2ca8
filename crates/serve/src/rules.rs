//! The rules over arguments (`--rules FILE`, Cedar) on a team's server: one text in force on
//! every replica, the one the approvers last approved, kept in the records.
//!
//! Rules can open a call that needed a click, so an edit of them is itself something a person
//! approves, as at the desk (docs/design.md, "Policy over arguments: `policy.cedar`"):
//!
//! * the first start with `--rules` and no rules on record takes the file, as the desk takes its
//!   first `policy.cedar`; from then on the record is what applies, whatever the file says;
//! * an edit of the file, seen within [`READ_EVERY`] by a replica that has approvers to ask, is
//!   proposed to them as a change ([`Engine::propose`]): its old and new text, and what it widens
//!   as the solver decided it (or that it is not known). The approvers see it beside the calls,
//!   at their desks and on the approvers' page, and decide it with a signed decision like any
//!   call's, [`ApproverListen`](crate::start::ApproverListen)'s `--rules-approvers` of them;
//! * approved, the new text is put on record; every replica reads the record every
//!   [`READ_EVERY`] and puts what it finds in force, so a change reaches all of them within that
//!   bound. Denied, the file's text is not proposed again until the file (or the record)
//!   changes again;
//! * a proposal says what it would change from the rules on record: when the record moves (a
//!   change approved through any replica) or the file is edited again, what waited is withdrawn
//!   (within [`READ_EVERY`]), and a change whose analysis ends after the keeper moved on, or
//!   after the record moved, is not queued;
//! * a text that does not load is never proposed (the log says its line and why): the rules on
//!   record stay in force.
//!
//! A server without approvers cannot have an edit approved: it says so in its log and keeps the
//! rules on record.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use countersign_core::sync::lock;
use countersign_engine::{Change, ChangeDecision, ChangeKind, Engine, MAX_CHANGE_TEXT_CHARS};
use countersign_registry::rules::what_it_changes;
use countersign_registry::rules_in;
use countersign_store::{Records, StoreError};

/// The name the rules in force are kept under in the records.
pub const RECORD: &str = "policy.cedar";

/// How often each replica reads the rules on record (and the `--rules` file for edits): the
/// bound on how long an approved change takes to be in force everywhere.
pub const READ_EVERY: Duration = Duration::from_secs(1);

/// The origin a proposed change names. The same on every replica, so that replicas sharing one
/// edited file propose one change, which the approvers see once.
const ORIGIN: &str = "the --rules file of this team server, edited";

/// The rules in force at start: the record's, or (nothing on record yet) `file`'s, which the
/// record then keeps. `None`: no rules.
pub async fn at_start(
    records: &dyn Records,
    file: Option<&str>,
    now_ms: u64,
) -> Result<Option<String>, StoreError> {
    let text = match (records.accepted(RECORD).await?, file) {
        (Some(on_record), file) => {
            if file.is_some_and(|f| f != on_record.text) {
                tracing::warn!(target: "rules", "the --rules file differs from the rules on record: the record's are in force, and the file's are proposed to the approvers");
            }
            on_record.text
        }
        (None, Some(file)) => {
            records.accept(RECORD, file, now_ms).await?;
            file.to_owned()
        }
        (None, None) => return Ok(None),
    };
    Ok(rules_in(&text).map(str::to_owned))
}

/// Keeps a replica's rules those on record, and proposes edits of its `--rules` file.
pub struct TeamRules {
    /// The authority the rules are put in force in.
    pub engine: Engine,
    /// Where the rules in force are kept.
    pub records: Arc<dyn Records>,
    /// The `--rules` file, if one was named.
    pub file: Option<PathBuf>,
    /// Whether there are approvers to propose an edit to.
    pub can_ask: bool,
}

/// What a replica's rules keeper knows, shared with the change it proposes: the two are
/// compared and changed under one lock, so a change whose analysis ended after it went stale
/// (the record moved, the file changed again) is never queued.
struct Known {
    /// The rules on record, as last read.
    on_record: Option<String>,
    /// The file's text last proposed (waiting, or decided): not proposed again until the file
    /// changes, or the record does.
    proposed: Option<String>,
}

impl TeamRules {
    /// Runs for as long as the server does.
    pub async fn keep(self) {
        let this = Arc::new(self);
        let on_record = this
            .records
            .accepted(RECORD)
            .await
            .ok()
            .flatten()
            .map(|a| a.text);
        let known = Arc::new(Mutex::new(Known {
            on_record,
            proposed: None,
        }));
        let mut said_nobody = false;
        let mut tick = tokio::time::interval(READ_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match this.records.accepted(RECORD).await {
                Ok(Some(read)) if lock(&known).on_record.as_deref() != Some(read.text.as_str()) => {
                    this.engine
                        .adopt_rules(rules_in(&read.text).map(str::to_owned));
                    tracing::info!(target: "rules", generation = this.engine.rules_generation(), "the rules on record changed: in force here now");
                    let mut seen = lock(&known);
                    seen.on_record = Some(read.text);
                    if seen.proposed.take().is_some() {
                        // Decided (here or on another replica), or the record moved otherwise:
                        // what waits here no longer says what it would change.
                        this.engine.withdraw_change(ChangeKind::Policy, RECORD);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    // The rules in force stay: a read that fails changes nothing.
                    tracing::debug!(target: "rules", error = %e, "cannot read the rules on record");
                }
            }
            let Some(path) = &this.file else { continue };
            let Ok(text) = tokio::fs::read_to_string(path).await else {
                continue;
            };
            let mut seen = lock(&known);
            let before = seen.on_record.clone().unwrap_or_default();
            if text == before {
                if seen.proposed.take().is_some() {
                    this.engine.withdraw_change(ChangeKind::Policy, RECORD);
                }
                continue;
            }
            if seen.proposed.as_deref() == Some(text.as_str()) {
                continue;
            }
            if !this.can_ask {
                if !said_nobody {
                    tracing::warn!(target: "rules", "the --rules file was edited, but this server has no approvers to approve it: the rules on record stay in force");
                    said_nobody = true;
                }
                continue;
            }
            if seen.proposed.is_some() {
                // What waits is no longer what the file says.
                this.engine.withdraw_change(ChangeKind::Policy, RECORD);
            }
            seen.proposed = Some(text.clone());
            let record = seen.on_record.clone();
            drop(seen);
            tokio::spawn(this.clone().propose(known.clone(), record, text));
        }
    }

    /// Proposes `after` in place of the rules on record (`record`, as the keeper read them) to
    /// the approvers, and puts it on record in their place when they
    /// approve it; unless, once its analysis is done, it went stale (the keeper moved on).
    async fn propose(
        self: Arc<Self>,
        known: Arc<Mutex<Known>>,
        record: Option<String>,
        after: String,
    ) {
        let before = record.clone().unwrap_or_default();
        if let Some(rules) = rules_in(&after)
            && let Err(why) = self.engine.check_rules(rules)
        {
            tracing::warn!(target: "rules", code = why.code(), "the --rules file does not load, so it is not proposed; the rules on record stay in force: {why}");
            return;
        }
        if after.chars().nth(MAX_CHANGE_TEXT_CHARS).is_some() {
            tracing::warn!(target: "rules", "the --rules file is longer than an approver is shown ({MAX_CHANGE_TEXT_CHARS} characters), so it is not proposed; the rules on record stay in force");
            return;
        }
        let analysis = what_it_changes(&self.engine, &before, &after).await;
        // The solver may take seconds, and a change approved through another replica meanwhile
        // moves the record before this replica's keeper reads it (within READ_EVERY). Read it
        // again: a change is proposed only against the rules on record. Stale, it is dropped;
        // the keeper proposes the file's text again against the new record once it reads it.
        match self.records.accepted(RECORD).await {
            Ok(read) if read.as_ref().map(|a| &a.text) == record.as_ref() => {}
            Ok(_) => {
                tracing::debug!(target: "rules", "the rules on record moved while a change was analysed: not proposed");
                return;
            }
            // The keeper's own reading is checked below; a read that fails decides nothing.
            Err(e) => {
                tracing::debug!(target: "rules", error = %e, "cannot read the rules on record again before proposing");
            }
        }
        let change = Change {
            kind: ChangeKind::Policy,
            subject: RECORD.to_owned(),
            summary: "The rules over arguments of this team server (policy.cedar) change"
                .to_owned(),
            before: Some(before.clone()),
            after: Some(after.clone()),
            origin: ORIGIN.to_owned(),
            analysis: Some(analysis),
        };
        let proposal = {
            let seen = lock(&known);
            let current =
                seen.on_record == record && seen.proposed.as_deref() == Some(after.as_str());
            if !current {
                tracing::debug!(target: "rules", "a rules change went stale while it was analysed: not proposed");
                return;
            }
            // Queued under the keeper's lock: a withdrawal the keeper makes after this finds it.
            self.engine.queue_proposal(change)
        };
        tracing::info!(target: "rules", "the --rules file was edited: proposed to the approvers");
        match proposal.decided().await {
            ChangeDecision::Approved => {
                let now = self.engine.now_ms();
                // Only in place of the text the approvers were shown as "before": what the
                // change widens was decided against it. Moved since (another change approved
                // meanwhile), it is not applied; the keeper proposes the file's text again
                // against the record as it is.
                match self
                    .records
                    .replace_accepted(RECORD, record.as_deref(), &after, now)
                    .await
                {
                    Ok(true) => {
                        tracing::info!(target: "rules", "the approvers approved the rules change: on record, in force on every replica within {READ_EVERY:?}")
                    }
                    Ok(false) => {
                        tracing::warn!(target: "rules", "the approvers approved a rules change whose \"before\" is no longer the rules on record (another change was approved meanwhile): not applied; the file's text is proposed again against the rules on record")
                    }
                    Err(e) => {
                        tracing::warn!(target: "rules", error = %e, "the approved rules change could not be put on record: the rules on record stay in force; edit the file again to propose it again")
                    }
                }
            }
            ChangeDecision::Denied { note } => {
                tracing::warn!(target: "rules", note = note.as_deref().unwrap_or(""), "the approvers denied the rules change: the rules on record stay in force")
            }
            ChangeDecision::Withdrawn => {
                tracing::debug!(target: "rules", "a proposed rules change left the queue undecided")
            }
        }
    }
}
