//! This desk as an approver of team servers (`countersign serve`).
//!
//! A person enrolls the desk with a server once: `countersign approver enroll URL --ca FILE`
//! makes the desk's approver key (Ed25519, kept in the OS keychain like the desk's own secret;
//! one key per desk, whatever the number of servers), remembers the server and the certificate
//! authority its listener's certificate comes from (`approvers.json` in the desk's configuration
//! folder; nothing secret), and prints the line the team runs to register the key:
//! `countersign serve approver add NAME ed25519:…`.
//!
//! The desk's certificate is not issued by anyone: the desk makes a self-signed certificate of
//! the approver key itself, and the server lets in exactly the keys it registered (pinning). So
//! nothing is to be requested, renewed or revoked at a certificate authority; revoking the
//! approver on the server is enough.
//!
//! While the desk runs, it reads each enrolled server's waiting calls over mutual TLS and puts
//! them in its own queue, marked with the server, beside local ones ([`Remote`]). Approve and
//! Deny on such a request sign the decision with the approver key and send it to the server,
//! which checks it before anything is minted there. This desk never mints for them.

mod enroll;
mod remote;

pub use enroll::{Enrolled, Enrollments, EnrollmentsError, FILE, KEY_ITEM, command, key};
pub use remote::{DECISION_TTL_MS, ExchangeError, REMOTE_IDS, Remote, RemoteError};

#[cfg(test)]
mod tests {
    use super::remote::parse;
    use super::*;
    use base64::Engine as _;
    use countersign_core::{Plan, PlanHash};
    use countersign_secret::Items;
    use countersign_secret::MemoryItems;
    use serde_json::{Value, json};

    fn listed(plan: &Plan, hash: &PlanHash) -> Value {
        json!({
            "id": 7,
            "plan": plan,
            "text": "the plan",
            "arrived_at_ms": 1,
            "preview": null,
            "asks": {"kind": "call", "tenant": "key:ci@server:db", "client_info": {"name": "ci"},
                     "server": "server:db", "plan_hash": hash.to_hex(), "class": "once",
                     "type_target": true, "approvers": 2, "token_ttl_ms": 600000, "why": "policy"},
        })
    }

    fn plan() -> Plan {
        Plan {
            tool: "execute".into(),
            target: "notes".into(),
            action: "execute".into(),
            summary: "DELETE from notes".into(),
            details: json!({"sql": "DELETE FROM notes"}),
            reversible: false,
        }
    }

    #[test]
    fn a_listed_call_is_taken_only_when_its_plan_hashes_to_its_hash() {
        let plan = plan();
        let hash = plan.hash().unwrap();
        let (id, call, shown_plan, _) = parse(&listed(&plan, &hash), "https://team").unwrap();
        assert_eq!(
            (id, call.approvers, call.tenant.as_str()),
            (7, 2, "key:ci@server:db")
        );
        assert_eq!(call.server, "server:db at https://team");
        assert_eq!(shown_plan, plan);
        // A server that shows one plan and names another's hash is not believed.
        let other = PlanHash::from_bytes([9; 32]);
        assert!(parse(&listed(&plan, &other), "https://team").is_none());
        // Nor is an open class, or a change, or a shape it does not know.
        let mut open = listed(&plan, &hash);
        open["asks"]["class"] = json!("open");
        assert!(parse(&open, "https://team").is_none());
        let mut change = listed(&plan, &hash);
        change["asks"]["kind"] = json!("change");
        assert!(parse(&change, "https://team").is_none());
        assert!(parse(&json!({"id": "7"}), "https://team").is_none());
    }

    /// A listing is another machine's bytes: any required member missing or of the wrong type
    /// (the tenant a number, a hash that is not hex, an id that is a string or negative, a class
    /// it does not know, no lifetime) makes it no request at all, never a request with a guess.
    #[test]
    fn a_listing_with_a_member_missing_or_of_the_wrong_type_is_no_request() {
        let plan = plan();
        let hash = plan.hash().unwrap();
        let spoiled: [(&str, Value); 9] = [
            ("/asks/tenant", json!(7)),
            ("/asks/tenant", Value::Null),
            ("/asks/plan_hash", json!("not hex")),
            ("/asks/class", json!("forever")),
            ("/asks/type_target", json!("yes")),
            ("/asks/token_ttl_ms", json!(-1)),
            ("/asks/server", json!(["server:db"])),
            ("/id", json!(-7)),
            ("/text", json!({"html": "<b>"})),
        ];
        for (pointer, value) in spoiled {
            let mut listing = listed(&plan, &hash);
            *listing.pointer_mut(pointer).unwrap() = value.clone();
            assert!(
                parse(&listing, "https://team").is_none(),
                "{pointer} = {value} was taken"
            );
        }
        let mut no_tenant = listed(&plan, &hash);
        no_tenant["asks"].as_object_mut().unwrap().remove("tenant");
        assert!(parse(&no_tenant, "https://team").is_none());
    }

    /// A change of a team server's rules, listed as the server lists it.
    fn listed_change(before: &str, after: &str) -> Value {
        use countersign_engine::text_hash;
        let plan = Plan {
            tool: "change:policy".into(),
            target: "policy.cedar".into(),
            action: "change".into(),
            summary: "The rules over arguments of this team server (policy.cedar) change".into(),
            details: json!({"origin": "the --rules file", "before_sha256": text_hash(before),
                            "after_sha256": text_hash(after)}),
            reversible: true,
        };
        let hash = plan.hash().unwrap();
        json!({
            "id": 9,
            "plan": plan,
            "text": "the plan",
            "arrived_at_ms": 1,
            "preview": null,
            "asks": {"kind": "change", "server": null, "tenant": "change",
                     "plan_hash": hash.to_hex(), "class": "once", "type_target": false,
                     "approvers": 2,
                     "change": {"kind": "policy", "subject": "policy.cedar",
                                "summary": "the rules change", "before": before, "after": after,
                                "origin": "the --rules file", "analysis": "It widens; calls the solver found: …"}},
        })
    }

    /// A team server's change of its rules is taken only when its plan is the plan hashed and
    /// names by hash exactly the texts shown: a server that shows one text and has another
    /// decided is not believed, nor one that lists any other change, tenant or class.
    #[test]
    fn a_listed_rules_change_is_taken_only_when_its_plan_names_the_texts_shown() {
        use super::remote::listed;
        use countersign_engine::Asks;
        let (before, after) = ("forbid (principal, action, resource);", "");
        let listing = listed_change(before, after);
        let taken = listed(&listing, "https://team").expect("a well-formed change is taken");
        assert_eq!(taken.id, 9);
        assert_eq!(taken.signed.tenant, "change");
        assert_eq!(taken.signed.class, countersign_core::GateClass::Once);
        assert!(!taken.signed.type_target);
        assert_eq!(taken.signed.plan_hash, taken.plan.hash().unwrap());
        let Asks::Change(asked) = &taken.asks else {
            panic!("a change is shown as a change")
        };
        assert_eq!(asked.change.before.as_deref(), Some(before));
        assert_eq!(asked.change.after.as_deref(), Some(after));
        assert_eq!(asked.change.origin, "the --rules file at https://team");
        assert!(
            asked
                .change
                .analysis
                .as_deref()
                .unwrap()
                .starts_with("It widens")
        );

        // Each member of the wrong type too: no guess is made of another machine's bytes.
        let spoiled: [(&str, Value); 15] = [
            ("/asks/change/before", json!(7)),
            ("/asks/change/after", json!(["forbid"])),
            (
                "/asks/change/analysis",
                json!({"html": "<b>it only tightens</b>"}),
            ),
            ("/asks/change/summary", Value::Null),
            ("/asks/change/origin", json!(false)),
            ("/id", json!("9")),
            ("/plan/details/after_sha256", Value::Null),
            // Another text shown than the one the plan names.
            (
                "/asks/change/after",
                json!("permit (principal, action, resource);"),
            ),
            ("/asks/change/before", json!("")),
            ("/asks/change/subject", json!("servers.json")),
            ("/asks/change/kind", json!("server")),
            ("/asks/tenant", json!("key:ci")),
            ("/asks/class", json!("token")),
            (
                "/asks/plan_hash",
                json!(PlanHash::from_bytes([7; 32]).to_hex()),
            ),
            (
                "/asks/change/after",
                json!("x".repeat(countersign_engine::MAX_CHANGE_TEXT_CHARS + 1)),
            ),
        ];
        for (pointer, value) in spoiled {
            let mut listing = listed_change(before, after);
            *listing.pointer_mut(pointer).unwrap() = value.clone();
            assert!(
                listed(&listing, "https://team").is_none(),
                "{pointer} = {value} was taken"
            );
        }
        // A text beyond what is shown whole is refused even when the plan names it.
        let long = "x".repeat(countersign_engine::MAX_CHANGE_TEXT_CHARS + 1);
        assert!(listed(&listed_change(before, &long), "https://team").is_none());
    }

    /// A listing with a key written twice (`after` once as the text its plan names, once as
    /// another): whichever the parser keeps is the one shown, and it is taken only when it is the
    /// one the plan names. Shown one text and signed over another: never.
    #[test]
    fn a_rules_change_listed_with_a_key_twice_is_shown_as_signed_or_not_at_all() {
        use super::remote::listed;
        use countersign_engine::Asks;
        let listing = listed_change("", "forbid (principal, action, resource);").to_string();
        let named = r#""after":"forbid (principal, action, resource);""#;
        assert!(listing.contains(named), "{listing}");
        let evil = r#""after":"permit (principal, action, resource);""#;
        for twice in [format!("{evil},{named}"), format!("{named},{evil}")] {
            let text = listing.replacen(named, &twice, 1);
            let parsed: Value = serde_json::from_str(&text).unwrap();
            match listed(&parsed, "https://team") {
                Some(taken) => {
                    let Asks::Change(asked) = &taken.asks else {
                        panic!("not a change")
                    };
                    assert_eq!(
                        asked.change.after.as_deref(),
                        Some("forbid (principal, action, resource);"),
                        "shown another text than the one signed"
                    );
                }
                None => assert_eq!(
                    parsed["asks"]["change"]["after"],
                    "permit (principal, action, resource);"
                ),
            }
        }
    }

    #[test]
    fn enrolling_keeps_one_key_and_the_servers_and_forgetting_removes_one() {
        let dir = tempfile::tempdir().unwrap();
        let items = MemoryItems::new();
        let ca = dir.path().join("ca.pem");
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(&ca, cert.cert.pem()).unwrap();
        let ca = ca.to_str().unwrap().to_owned();
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let enroll = |url: &str| {
            command(
                dir.path(),
                &items,
                &args(&["enroll", url, "--ca", ca.as_str()]),
            )
        };
        assert_eq!(enroll("https://a.example:9443"), 0);
        let first = key(&items, false).unwrap().unwrap().public();
        assert_eq!(enroll("https://b.example:9443"), 0);
        assert_eq!(
            key(&items, false).unwrap().unwrap().public(),
            first,
            "one key per desk"
        );
        // Refused: not https, no certificate in the CA file, a usage error.
        assert_eq!(enroll("http://a.example"), 2);
        let not_pem = dir.path().join("empty.pem");
        std::fs::write(&not_pem, "nothing").unwrap();
        let bad_ca = args(&[
            "enroll",
            "https://c.example",
            "--ca",
            not_pem.to_str().unwrap(),
        ]);
        assert_eq!(command(dir.path(), &items, &bad_ca), 2);
        assert_eq!(command(dir.path(), &items, &args(&["enroll"])), 2);
        let urls: Vec<String> = Enrollments::load(dir.path())
            .unwrap()
            .servers
            .into_keys()
            .collect();
        assert_eq!(urls, ["https://a.example:9443", "https://b.example:9443"]);
        assert_eq!(
            command(
                dir.path(),
                &items,
                &args(&["forget", "https://a.example:9443"])
            ),
            0
        );
        assert_eq!(
            command(
                dir.path(),
                &items,
                &args(&["forget", "https://a.example:9443"])
            ),
            2
        );
        assert_eq!(Enrollments::load(dir.path()).unwrap().servers.len(), 1);
        // The file holds nothing secret: not the key's seed.
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        let seed = key(&items, false).unwrap().unwrap().seed();
        let b64 = base64::engine::general_purpose::STANDARD.encode(seed.as_slice());
        assert!(!text.contains(&b64));
    }

    #[test]
    fn a_damaged_key_in_the_keychain_is_an_error_never_replaced() {
        let items = MemoryItems::new();
        items.set(KEY_ITEM, "not base64!").unwrap();
        assert!(key(&items, true).is_err());
        assert_eq!(
            items.get(KEY_ITEM).unwrap().unwrap().as_str(),
            "not base64!"
        );
    }
}
