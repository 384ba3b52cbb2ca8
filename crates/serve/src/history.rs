//! `countersign serve history [--json] [--tool T] [--limit N] [--decisions]`: what the server's
//! records say happened (every confirm event, as the desk's `countersign history` prints its
//! own), or the approvers' signed decisions; with `--verify [--key KEY] [--head FILE]`, the check of
//! the history's signed chain.

use clap::Parser;
use countersign_serve::cli::HistoryArgs;
use countersign_store::{HistoryFilter, MAX_DECISION_ROWS, Roster};

use crate::roster::with_records;

/// Why a `--head` file gave no signed heads.
#[derive(Debug, thiserror::Error)]
enum HeadFileError {
    /// The file could not be read.
    #[error("{0}")]
    Read(#[source] std::io::Error),
    /// The file holds no signed head, or a line that says it is one and is not.
    #[error("{0}")]
    Heads(#[source] countersign_core::chain::HeadsError),
}

/// Runs the command; answers the exit code.
pub fn main() -> i32 {
    let args = HistoryArgs::parse_from(
        std::iter::once(std::ffi::OsString::from("countersign serve history"))
            .chain(std::env::args_os().skip(2)),
    );
    let me = "countersign serve history";
    let key = match args.key.as_deref() {
        None => None,
        Some(text) => match countersign_core::approver::parse_public_key(text) {
            Some(key) => Some(key),
            None => {
                eprintln!("{me}: --key {text:?} is not a key (ed25519:…)");
                return 2;
            }
        },
    };
    let mut walk = countersign_core::chain::Walk::new(key);
    for path in &args.head {
        let heads = std::fs::read_to_string(path)
            .map_err(HeadFileError::Read)
            .and_then(|text| {
                countersign_core::chain::heads_in(&text).map_err(HeadFileError::Heads)
            });
        match heads {
            Ok(heads) => {
                for kept in heads {
                    if let Err(broken) = walk.expect(kept) {
                        println!(
                            "{}",
                            countersign_core::chain::describe(&Err(broken), key.is_some())
                        );
                        return 1;
                    }
                }
            }
            Err(e) => {
                eprintln!("{me}: --head {}: {e}", path.display());
                return 2;
            }
        }
    }
    for point in &args.seen {
        match countersign_core::chain::seen_in(point) {
            Ok((seq, hash)) => walk.expect_seen(seq, hash),
            Err(e) => {
                eprintln!("{me}: {e}");
                return 2;
            }
        }
    }
    with_records(me, args.data_dir.clone(), |records| async move {
        if args.verify {
            return match records.verify_history(walk).await {
                Ok(result) => {
                    println!(
                        "{}",
                        countersign_core::chain::describe(&result, key.is_some())
                    );
                    i32::from(result.is_err())
                }
                Err(e) => {
                    eprintln!("{me}: {e}");
                    3
                }
            };
        }
        let limit = args.limit.max(1);
        if args.decisions {
            let (decisions, approvers) = match (
                records.decisions(limit.min(MAX_DECISION_ROWS)).await,
                records.members(Roster::Approvers).await,
            ) {
                (Ok(d), Ok(a)) => (d, a),
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("{me}: {e}");
                    return 3;
                }
            };
            for d in decisions.iter().rev() {
                if args.json {
                    println!("{}", countersign_serve::kept::decision_json(d, &approvers));
                } else {
                    let by = match d.evidence {
                        countersign_store::Evidence::Desk { .. } => "desk",
                        countersign_store::Evidence::Passkey(_) => "passkey",
                    };
                    println!(
                        "{:>13}  {:<8} {:<8} {:<16} {:<20} {:<24} {}",
                        d.decided_at_ms,
                        d.verdict.code(),
                        by,
                        d.approver,
                        d.tool,
                        d.target,
                        d.tenant
                    );
                }
            }
            return 0;
        }
        let mut filter = HistoryFilter::default().limit(u32::try_from(limit).unwrap_or(u32::MAX));
        if let Some(tool) = args.tool {
            filter = filter.tool(tool);
        }
        match records.history(&filter).await {
            Ok(events) => {
                for e in events {
                    if args.json {
                        match serde_json::to_string(&e) {
                            Ok(line) => println!("{line}"),
                            Err(err) => eprintln!("{me}: {err}"),
                        }
                    } else {
                        println!("{}", e.table_row());
                    }
                }
                0
            }
            Err(e) => {
                eprintln!("{me}: {e}");
                3
            }
        }
    })
}
