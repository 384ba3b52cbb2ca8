//! Any text either is refused with a typed error or canonicalizes to a fixed point whose plan
//! hashes and renders without panicking, however deep or odd the input.
#![no_main]

use countersign_core::canonical::{parse_strict, to_string};
use countersign_core::plan::Plan;
use countersign_core::render::plan_text;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(details) = parse_strict(text) else { return };
    let Ok(canonical) = to_string(&details) else { return };
    let again = to_string(&parse_strict(&canonical).expect("canonical text parses")).unwrap();
    assert_eq!(canonical, again, "canonical text is not a fixed point");
    let plan = Plan {
        tool: "t".into(),
        target: "x".into(),
        action: "a".into(),
        summary: "s".into(),
        details,
        reversible: false,
    };
    if plan.hash().is_ok() {
        let _ = plan_text(&plan);
    }
});
