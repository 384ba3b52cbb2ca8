//! `countersign serve verify-decisions --roster FILE [--origin URL] [FILE]`: checks kept
//! decisions offline (see `countersign_serve::kept`), one line of output per decision.

use std::io::{BufRead, Write};

use clap::Parser;
use countersign_serve::cli::VerifyArgs;
use countersign_serve::kept;
use serde_json::Value;

/// Runs the command; answers the exit code.
pub fn main() -> i32 {
    let me = "countersign serve verify-decisions";
    let args = VerifyArgs::parse_from(
        std::iter::once(std::ffi::OsString::from(me)).chain(std::env::args_os().skip(2)),
    );
    let roster: Value = match std::fs::read_to_string(&args.roster)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
    {
        Some(r) => r,
        None => {
            eprintln!(
                "{me}: {}: not a roster (countersign serve approver export)",
                args.roster.display()
            );
            return 2;
        }
    };
    let origin = match args
        .origin
        .as_deref()
        .map(countersign_serve::web::passkey::origin)
    {
        None => None,
        Some(Ok(o)) => Some(o),
        Some(Err(e)) => {
            eprintln!("{me}: --origin: {e}");
            return 2;
        }
    };
    let input: Box<dyn BufRead> = match &args.decisions {
        Some(path) => match std::fs::File::open(path) {
            Ok(f) => Box::new(std::io::BufReader::new(f)),
            Err(e) => {
                eprintln!("{me}: {}: {e}", path.display());
                return 2;
            }
        },
        None => Box::new(std::io::stdin().lock()),
    };
    let (mut proven, mut unproven) = (0, 0);
    let mut out = std::io::stdout().lock();
    for line in input.lines() {
        let Ok(line) = line else {
            eprintln!("{me}: the decisions cannot be read");
            return 2;
        };
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        let who = format!(
            "{}\t{}\t{}\t{}\t{}",
            parsed["request"],
            parsed["approver"],
            parsed["verdict"],
            parsed["tool"],
            parsed["target"]
        );
        match kept::verify(&roster, origin.as_ref(), &parsed) {
            Ok(()) => {
                proven += 1;
                let _ = writeln!(out, "proven\t{}\t{who}", parsed["by"]);
            }
            Err(why) => {
                unproven += 1;
                let _ = writeln!(out, "UNPROVEN\t{}\t{who}\t{}", why.code(), why);
            }
        }
    }
    eprintln!("{me}: {proven} proven, {unproven} not");
    if unproven > 0 { 1 } else { 0 }
}
