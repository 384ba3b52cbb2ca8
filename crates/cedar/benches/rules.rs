//! What a Cedar policy costs a call, and what the analysis of a change costs a person waiting.
//!
//! Printed, never asserted (the machines are shared and noisy):
//! - **evaluation per call**, p50 and p99, with 1, 100 and 1,000 rules, beside today's TOML
//!   policy deciding the same tool from a file with as many tool entries; measured interleaved,
//!   in rounds, so machine noise hits both alike, and printed as a ratio;
//! - **the analysis of a typical change** (one open rule added to the docs' example policy, and
//!   the same policy with a rule removed), wall time, with the cvc5 at `CVC5` or
//!   `target/peers/bin/cvc5` (skipped, and said so, when there is none).
//!
//! `cargo bench -p countersign-cedar --bench rules`; `COUNTERSIGN_BENCH_CALLS` (default 20000 per
//! arm and size). Run as a test (`cargo test --benches`) it only smoke-tests with a few calls.
#![allow(missing_docs)] // a bench's `main`

use std::path::PathBuf;
use std::time::{Duration, Instant};

use countersign_cedar::{Call, Outcome, Rules, Tool, Widening, widening};
use serde_json::json;

fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "query",
            &json!({"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]}),
            false,
        ),
        Tool::new(
            "execute",
            &json!({"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]}),
            true,
        ),
        Tool::new(
            "write_file",
            &json!({"type": "object", "properties": {
                "path": {"type": "string"}, "content": {"type": "string"}
            }, "required": ["path", "content"]}),
            true,
        ),
    ]
}

/// `n` rules: open writes under `dir0/` … `dir{n-2}/`, and one forbid of DROP at night.
fn cedar_rules(n: usize) -> String {
    let mut text = String::from(
        "@reason(\"no DROP at night\")\nforbid (principal, action == Countersign::Action::\"execute\", resource)\nwhen { context.arguments.sql like \"*DROP*\" && context.hour < 6 };\n",
    );
    for i in 0..n.saturating_sub(1) {
        text.push_str(&format!(
            "@class(\"open\")\npermit (principal, action == Countersign::Action::\"write_file\", resource)\nwhen {{ context.arguments.path like \"dir{i}/*\" }};\n"
        ));
    }
    text
}

/// A TOML policy with `n` tool entries on the server.
fn toml_policy(n: usize) -> countersign_core::policy::Policy {
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!(
            "[servers.\"builtin:app.sqlite\".tools.tool{i}]\nclass = \"token\"\n"
        ));
    }
    text.push_str("[servers.\"builtin:app.sqlite\".tools.write_file]\nclass = \"once\"\n");
    countersign_core::policy::Policy::from_toml(&text).expect("the TOML policy parses")
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn solver() -> Option<PathBuf> {
    std::env::var_os("CVC5").map(PathBuf::from).or_else(|| {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/peers/bin/cvc5");
        path.exists().then_some(path)
    })
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let calls: usize = std::env::var("COUNTERSIGN_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benching { 20_000 } else { 50 })
        .max(1);
    let tools = tools();
    let arguments = json!({"path": "dir0/notes.md", "content": "x"});
    let last = json!({"path": "elsewhere/notes.md", "content": "x"});
    let tool_definition = json!({"name": "write_file", "annotations": {"destructiveHint": true}});
    println!("policy evaluation per call ({calls} calls per arm, interleaved in rounds of 100):");
    println!(
        "  {:>6}  {:>14} {:>14}  {:>14} {:>14}  {:>8}",
        "rules", "cedar p50 µs", "cedar p99 µs", "toml p50 µs", "toml p99 µs", "p50 ×"
    );
    for n in [1usize, 100, 1_000] {
        let rules = Rules::parse(&cedar_rules(n), &tools).expect("the generated policy loads");
        let toml = toml_policy(n);
        let (mut cedar, mut plain) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
        let call = |arguments| Call {
            tenant: "key:ci@builtin:app.sqlite",
            server: "builtin:app.sqlite",
            tool: "write_file",
            target: "notes.md",
            action: "write_file",
            summary: "write notes.md",
            reversible: false,
            class: "once",
            destructive: true,
            hour: 12,
            arguments,
        };
        // The worst case for Cedar: a call no rule matches, so every rule is tried.
        let probe = if n > 1 { &last } else { &arguments };
        for round in 0..calls.div_ceil(100) {
            let count = 100.min(calls - round * 100);
            for _ in 0..count {
                let started = Instant::now();
                let outcome = rules.decide(&call(probe));
                cedar.push(started.elapsed());
                assert!(matches!(outcome, Outcome::Unruled | Outcome::Gated(_)));
            }
            for _ in 0..count {
                let started = Instant::now();
                let rule = toml.rule("builtin:app.sqlite", &tool_definition);
                plain.push(started.elapsed());
                std::hint::black_box(rule);
            }
        }
        cedar.sort();
        plain.sort();
        println!(
            "  {n:>6}  {:>14.1} {:>14.1}  {:>14.2} {:>14.2}  {:>8.1}",
            micros(percentile(&cedar, 0.5)),
            micros(percentile(&cedar, 0.99)),
            micros(percentile(&plain, 0.5)),
            micros(percentile(&plain, 0.99)),
            micros(percentile(&cedar, 0.5)) / micros(percentile(&plain, 0.5)).max(0.001)
        );
    }

    println!("the analysis of a change (what it widens), wall time:");
    let Some(solver) = solver() else {
        println!("  skipped: no cvc5 (`.ci/setup tests` installs one; or name it with CVC5)");
        return;
    };
    let example = include_str!("../policies/example.cedar");
    let widened = format!(
        "{example}\n@class(\"open\")\npermit (principal, action == Countersign::Action::\"write_file\", resource)\nwhen {{ context.arguments.path like \"docs/*\" }};"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let old = Rules::parse(example, &tools).expect("the example loads");
    for (what, new) in [
        ("one open rule added", widened.as_str()),
        ("unchanged", example),
    ] {
        let new = Rules::parse(new, &tools).expect("the change loads");
        let mut times = Vec::new();
        let mut verdict = String::new();
        for _ in 0..if benching { 5 } else { 1 } {
            let started = Instant::now();
            let answer = runtime.block_on(widening(&old, &new, &solver, Duration::from_secs(120)));
            times.push(started.elapsed());
            verdict = match answer {
                Widening::OnlyTightens => "only tightens".into(),
                Widening::Widens(found) => format!("widens ({} ways)", found.len()),
                Widening::Unknown(why) => format!("unknown: {why}"),
            };
        }
        times.sort();
        println!(
            "  {what:<22} median {:>7.2} s, slowest {:>7.2} s  ({verdict})",
            percentile(&times, 0.5).as_secs_f64(),
            times.last().unwrap().as_secs_f64()
        );
    }
}
