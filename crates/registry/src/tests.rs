//! The registry against a real engine and SQLite file, with the keychain in memory (the real
//! keychain is used by the desk's end-to-end tests).
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use countersign_engine::{Engine, EngineConfig};
use countersign_secret::{Items, MemoryItems};
use countersign_wire::{RegistryAnswer, RegistryRequest, SecretText, ServerSpec};
use serde_json::json;

use super::*;

struct Fixture {
    dir: tempfile::TempDir,
    engine: Engine,
    items: Arc<MemoryItems>,
    registry: Registry,
}

/// The engine's records: the SQLite file at `db`.
fn sqlite(db: &std::path::Path) -> Arc<countersign_store::Sqlite> {
    Arc::new(countersign_store::Sqlite::open_deferred(
        db,
        countersign_store::StoreOptions::default(),
    ))
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("data/desk.sqlite");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    let mut config = EngineConfig::new();
    config.window = true;
    config.approve_delay_ms = 0;
    let key = countersign_secret::HmacSecret::from_bytes([7; 32]).signing_key();
    let records = sqlite(&db);
    let engine = Engine::new(config, records.clone(), Ok(key));
    let items = Arc::new(MemoryItems::new());
    let registry = Registry::open(
        &dir.path().join("config"),
        records,
        Ok(items.clone() as Arc<dyn Items>),
        engine.clone(),
    )
    .unwrap();
    Fixture {
        dir,
        engine,
        items,
        registry,
    }
}

fn spec(v: serde_json::Value) -> ServerSpec {
    serde_json::from_value(v).unwrap()
}

fn secrets(pairs: &[(&str, &str)]) -> BTreeMap<String, SecretText> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), SecretText::new(v.to_string())))
        .collect()
}

fn put(name: &str, spec: ServerSpec, secrets: BTreeMap<String, SecretText>) -> RegistryRequest {
    RegistryRequest::Put {
        name: name.into(),
        spec,
        secrets,
    }
}

async fn ask(f: &Fixture, request: RegistryRequest) -> (RegistryAnswer, bool) {
    let mut waited = false;
    let answer = f
        .registry
        .handle(request, "a test (pid 1)", |_| waited = true)
        .await;
    (answer, waited)
}

/// `request` asked in the background, as a command line waiting for the person: its final
/// answer, and whether it was told to wait first.
fn in_background(
    f: &Fixture,
    request: RegistryRequest,
) -> tokio::task::JoinHandle<(RegistryAnswer, bool)> {
    let registry = f.registry.clone();
    tokio::spawn(async move {
        let mut waited = false;
        let answer = registry.handle(request, "a test", |_| waited = true).await;
        (answer, waited)
    })
}

fn gh() -> ServerSpec {
    spec(
        json!({"command": ["gh-server", "stdio"], "env": {"GITHUB_TOKEN": {"secret": true}, "LOG": "info"}}),
    )
}

/// Waits until one request is pending, and returns its id.
async fn pending_id(engine: &Engine) -> u64 {
    for _ in 0..200 {
        if let Some(r) = engine.pending().first() {
            return r.id;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no request became pending");
}

#[tokio::test]
async fn a_new_server_takes_effect_at_once_with_its_secret_only_in_the_keychain() {
    let f = fixture();
    let (answer, waited) = ask(
        &f,
        put("gh", gh(), secrets(&[("GITHUB_TOKEN", "ghp_s3cret")])),
    )
    .await;
    assert!(matches!(answer, RegistryAnswer::Done { .. }), "{answer:?}");
    assert!(!waited);
    let resolved = f.registry.resolve("gh").unwrap();
    let values: BTreeMap<_, _> = resolved
        .values
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(values["GITHUB_TOKEN"], "ghp_s3cret");
    assert_eq!(values["LOG"], "info");
    let file = std::fs::read_to_string(f.dir.path().join("config/servers.json")).unwrap();
    assert!(
        file.contains("GITHUB_TOKEN") && !file.contains("ghp_s3cret"),
        "{file}"
    );
    assert!(!format!("{resolved:?}").contains("ghp_s3cret"));
    let history = f.engine.history(&Default::default()).await.unwrap();
    assert_eq!(history[0].kind.code(), "changed");
    assert_eq!(history[0].target.as_deref(), Some("gh"));
}

#[tokio::test]
async fn a_change_to_an_existing_server_does_nothing_until_the_person_approves() {
    let f = fixture();
    ask(&f, put("gh", gh(), secrets(&[("GITHUB_TOKEN", "old")]))).await;
    let evil =
        spec(json!({"command": ["sh", "-c", "steal"], "env": {"GITHUB_TOKEN": {"secret": true}}}));
    let proposal = in_background(&f, put("gh", evil, secrets(&[("GITHUB_TOKEN", "new")])));
    let id = pending_id(&f.engine).await;
    // Shown to the person, and nothing applied yet.
    let request = &f.engine.pending()[0];
    let change = request.change().expect("a change request");
    assert!(
        change
            .after
            .as_deref()
            .unwrap()
            .contains("command: sh -c steal")
    );
    assert!(change.after.as_deref().unwrap().contains("A NEW VALUE"));
    assert!(!change.after.as_deref().unwrap().contains("new\n"));
    assert_eq!(f.registry.servers()["gh"], gh());
    let token = f.registry.resolve("gh").unwrap();
    assert_eq!(
        token
            .values
            .iter()
            .find(|(k, _)| k == "GITHUB_TOKEN")
            .unwrap()
            .1
            .as_str(),
        "old"
    );
    f.engine.approve(id, None).await.unwrap();
    let (answer, waited) = proposal.await.unwrap();
    assert!(waited);
    assert!(matches!(answer, RegistryAnswer::Done { .. }), "{answer:?}");
    let resolved = f.registry.resolve("gh").unwrap();
    assert_eq!(resolved.spec.upstream.settings().len(), 1);
    assert_eq!(resolved.values[0].1.as_str(), "new");
}

#[tokio::test]
async fn a_denied_removal_leaves_the_server_and_its_secret() {
    let f = fixture();
    ask(&f, put("gh", gh(), secrets(&[("GITHUB_TOKEN", "t")]))).await;
    let proposal = in_background(&f, RegistryRequest::Remove { name: "gh".into() });
    let id = pending_id(&f.engine).await;
    f.engine.deny(id, Some("no")).await.unwrap();
    let (answer, _) = proposal.await.unwrap();
    assert!(
        matches!(&answer, RegistryAnswer::Denied { message } if message.contains("no")),
        "{answer:?}"
    );
    assert!(f.registry.resolve("gh").is_ok());
}

#[tokio::test]
async fn an_approved_removal_forgets_the_secret() {
    let f = fixture();
    ask(&f, put("gh", gh(), secrets(&[("GITHUB_TOKEN", "t")]))).await;
    let proposal = in_background(&f, RegistryRequest::Remove { name: "gh".into() });
    let id = pending_id(&f.engine).await;
    f.engine.approve(id, None).await.unwrap();
    assert!(matches!(
        proposal.await.unwrap().0,
        RegistryAnswer::Done { .. }
    ));
    assert!(matches!(
        f.registry.resolve("gh"),
        Err(ResolveError::NoSuchServer(_))
    ));
    let account = format!(
        "{}/server/gh/env/GITHUB_TOKEN",
        secrets::scope_of(&f.dir.path().join("data/desk.sqlite"))
    );
    assert_eq!(f.items.get(&account).unwrap(), None);
}

#[tokio::test]
async fn the_same_spec_again_is_no_change_but_secret_values_never_answer_whether_they_match() {
    let f = fixture();
    let plain = spec(json!({"command": ["x"], "env": {"LOG": "info"}}));
    ask(&f, put("plain", plain.clone(), secrets(&[]))).await;
    let (answer, waited) = ask(&f, put("plain", plain, secrets(&[]))).await;
    assert!(
        matches!(answer, RegistryAnswer::Done { .. }) && !waited,
        "{answer:?}"
    );
    assert!(f.engine.pending().is_empty());
    // With a secret value, right or wrong, the answer is the same: the person decides. An
    // instant "nothing changed" for the right one would be an oracle for guessing it.
    ask(&f, put("gh", gh(), secrets(&[("GITHUB_TOKEN", "t")]))).await;
    for guess in ["t", "wrong"] {
        let proposal = in_background(&f, put("gh", gh(), secrets(&[("GITHUB_TOKEN", guess)])));
        let id = pending_id(&f.engine).await;
        f.engine.deny(id, None).await.unwrap();
        let (answer, waited) = proposal.await.unwrap();
        assert!(
            waited && matches!(answer, RegistryAnswer::Denied { .. }),
            "{answer:?}"
        );
    }
}

#[tokio::test]
async fn bad_requests_are_refused_with_a_code_and_change_nothing() {
    let f = fixture();
    for request in [
        put("a b", gh(), secrets(&[("GITHUB_TOKEN", "t")])),
        put("gh", gh(), secrets(&[])),
        put("gh", gh(), secrets(&[("GITHUB_TOKEN", "t"), ("LOG", "x")])),
        RegistryRequest::Remove {
            name: "nope".into(),
        },
    ] {
        let (answer, _) = ask(&f, request).await;
        assert!(
            matches!(answer, RegistryAnswer::Refused { .. }),
            "{answer:?}"
        );
    }
    assert!(f.registry.servers().is_empty());
}

#[tokio::test]
async fn a_file_edited_behind_the_desks_back_applies_only_after_approval() {
    let f = fixture();
    ask(&f, put("gh", gh(), secrets(&[("GITHUB_TOKEN", "t")]))).await;
    let path = f.dir.path().join("config/servers.json");
    let edited = std::fs::read_to_string(&path)
        .unwrap()
        .replace("gh-server", "/tmp/evil");
    std::fs::write(&path, &edited).unwrap();
    f.registry.check_files();
    let id = pending_id(&f.engine).await;
    // Still the accepted command while the person looks.
    assert_eq!(f.registry.servers()["gh"], gh());
    // Checking again proposes nothing new.
    f.registry.check_files();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(f.engine.pending().len(), 1);
    f.engine.approve(id, None).await.unwrap();
    for _ in 0..100 {
        if f.registry.accepted_text(SERVERS) == edited {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        matches!(&f.registry.servers()["gh"].upstream, Upstream::Stdio { command, .. } if command[0] == "/tmp/evil")
    );
}

#[tokio::test]
async fn a_denied_file_edit_is_written_back() {
    let f = fixture();
    ask(&f, put("gh", gh(), secrets(&[("GITHUB_TOKEN", "t")]))).await;
    let path = f.dir.path().join("config/servers.json");
    let accepted = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, accepted.replace("gh-server", "/tmp/evil")).unwrap();
    f.registry.check_files();
    let id = pending_id(&f.engine).await;
    f.engine.deny(id, None).await.unwrap();
    for _ in 0..100 {
        if std::fs::read_to_string(&path).unwrap() == accepted {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the file was not written back");
}

#[tokio::test]
async fn a_policy_edited_behind_the_desks_back_applies_only_after_approval() {
    let f = fixture();
    let path = f.dir.path().join("config/policy.toml");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let text = "[servers.\"server:gh\".tools.delete_repo]\nclass = \"open\"\n";
    std::fs::write(&path, text).unwrap();
    f.registry.check_files();
    let id = pending_id(&f.engine).await;
    assert_eq!(f.registry.accepted_text(POLICY), "");
    f.engine.approve(id, None).await.unwrap();
    for _ in 0..100 {
        if f.registry.accepted_text(POLICY) == text {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the approved policy was not accepted");
}

#[tokio::test]
async fn the_first_start_adopts_the_files_as_found() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    std::fs::write(
        dir.path().join("config/servers.json"),
        r#"{"servers": {"x": {"command": ["x"]}}}"#,
    )
    .unwrap();
    let db = dir.path().join("desk.sqlite");
    let records = sqlite(&db);
    let engine = Engine::new(EngineConfig::new(), records.clone(), Err("none".into()));
    let registry = Registry::open(
        &dir.path().join("config"),
        records,
        Err(countersign_secret::SecretError::NoKeychain {
            detail: "no keychain".into(),
        }),
        engine,
    )
    .unwrap();
    assert!(registry.servers().contains_key("x"));
    // Without a keychain a server with no secrets still resolves.
    assert!(registry.resolve("x").is_ok());
}

#[tokio::test]
async fn backups_live_in_the_keychain() {
    let f = fixture();
    let key = "install/claude-desktop/0123abcd".to_string();
    let (answer, _) = ask(
        &f,
        RegistryRequest::KeepBackup {
            key: key.clone(),
            text: SecretText::new("{\"token\": \"t\"}".into()),
        },
    )
    .await;
    assert!(
        matches!(answer, RegistryAnswer::Backup { text: None }),
        "{answer:?}"
    );
    let (answer, _) = ask(&f, RegistryRequest::TakeBackup { key: key.clone() }).await;
    let RegistryAnswer::Backup { text: Some(text) } = answer else {
        panic!("{answer:?}")
    };
    assert_eq!(text.expose(), "{\"token\": \"t\"}");
    ask(&f, RegistryRequest::DropBackup { key: key.clone() }).await;
    let (answer, _) = ask(&f, RegistryRequest::TakeBackup { key }).await;
    assert!(matches!(answer, RegistryAnswer::Backup { text: None }));
}

#[tokio::test]
async fn a_broken_policy_from_the_settings_view_is_refused_and_the_accepted_one_kept() {
    let f = fixture();
    let good = "[servers.fs.tools.write_file]\nclass = \"token\"\n";
    f.registry.save_policy_directly(good).await.unwrap();
    assert!(
        f.registry
            .save_policy_directly("[servers.fs.tools.write_file]\nclass = \"maybe\"\n")
            .await
            .is_err()
    );
    assert_eq!(f.registry.accepted_text(POLICY), good);
    let on_disk = std::fs::read_to_string(f.dir.path().join("config/policy.toml")).unwrap();
    assert_eq!(on_disk, good);
}

fn value_of(f: &Fixture, name: &str, key: &str) -> String {
    let resolved = f.registry.resolve(name).unwrap();
    let (_, value) = resolved.values.iter().find(|(k, _)| k == key).unwrap();
    value.to_string()
}

#[tokio::test]
async fn an_edit_in_the_settings_view_that_leaves_a_secret_empty_keeps_the_stored_value() {
    let f = fixture();
    f.registry
        .put_directly_keeping("gh", &gh(), &secrets(&[("GITHUB_TOKEN", "ghp_first")]))
        .await
        .unwrap();
    // The command changes, the secret is not typed again: the keychain's value stays.
    let moved = spec(
        json!({"command": ["gh-server", "stdio", "--verbose"], "env": {"GITHUB_TOKEN": {"secret": true}, "LOG": "debug"}}),
    );
    f.registry
        .put_directly_keeping("gh", &moved, &BTreeMap::new())
        .await
        .unwrap();
    assert_eq!(f.registry.servers()["gh"], moved);
    assert_eq!(value_of(&f, "gh", "GITHUB_TOKEN"), "ghp_first");
    // Typed again, it is replaced.
    f.registry
        .put_directly_keeping("gh", &moved, &secrets(&[("GITHUB_TOKEN", "ghp_second")]))
        .await
        .unwrap();
    assert_eq!(value_of(&f, "gh", "GITHUB_TOKEN"), "ghp_second");
    // The person's edits apply directly, and each is recorded.
    assert!(f.engine.pending().is_empty());
    let history = f.engine.history(&Default::default()).await.unwrap();
    assert_eq!(
        history
            .iter()
            .filter(|e| e.kind.code() == "changed")
            .count(),
        3
    );
}

#[tokio::test]
async fn a_secret_left_empty_with_nothing_stored_for_it_is_refused_and_changes_nothing() {
    let f = fixture();
    // A new server: nothing to keep.
    let err = f
        .registry
        .put_directly_keeping("gh", &gh(), &BTreeMap::new())
        .await
        .unwrap_err();
    assert_eq!(err.code, RegistryCode::BadRequest);
    assert!(err.message.contains("GITHUB_TOKEN"), "{err}");
    assert!(f.registry.servers().is_empty());
    f.registry
        .put_directly_keeping("gh", &gh(), &secrets(&[("GITHUB_TOKEN", "t")]))
        .await
        .unwrap();
    // A key that was plain until now has no stored secret to keep.
    let log_secret = spec(
        json!({"command": ["gh-server", "stdio"], "env": {"GITHUB_TOKEN": {"secret": true}, "LOG": {"secret": true}}}),
    );
    let err = f
        .registry
        .put_directly_keeping("gh", &log_secret, &BTreeMap::new())
        .await
        .unwrap_err();
    assert!(err.message.contains("LOG"), "{err}");
    // An environment variable's secret is not kept as a header's.
    let as_url = spec(
        json!({"url": "https://gh.example/mcp", "headers": {"GITHUB_TOKEN": {"secret": true}}}),
    );
    assert!(
        f.registry
            .put_directly_keeping("gh", &as_url, &BTreeMap::new())
            .await
            .is_err()
    );
    assert_eq!(f.registry.servers()["gh"], gh());
    assert_eq!(value_of(&f, "gh", "GITHUB_TOKEN"), "t");
}

#[tokio::test]
async fn a_removal_in_the_settings_view_forgets_the_secrets_and_says_when_there_is_no_such_server()
{
    let f = fixture();
    f.registry
        .put_directly("gh", &gh(), &secrets(&[("GITHUB_TOKEN", "t")]))
        .await
        .unwrap();
    let account = &format!(
        "{}/server/gh/env/GITHUB_TOKEN",
        secrets::scope_of(&f.dir.path().join("data/desk.sqlite"))
    );
    assert!(f.items.get(account).unwrap().is_some());
    f.registry.remove_directly("gh").await.unwrap();
    assert!(f.registry.servers().is_empty());
    assert_eq!(f.items.get(account).unwrap(), None);
    assert_eq!(
        f.registry.remove_directly("gh").await.unwrap_err().code,
        RegistryCode::NoSuchServer
    );
}

#[tokio::test]
async fn two_desks_registering_one_name_keep_their_own_secrets() {
    let items = Arc::new(MemoryItems::new());
    let mut desks = Vec::new();
    for token in ["first", "second"] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("desk.sqlite");
        let mut config = EngineConfig::new();
        config.window = true;
        let records = sqlite(&db);
        let engine = Engine::new(config, records.clone(), Err("none".into()));
        let registry = Registry::open(
            &dir.path().join("config"),
            records,
            Ok(items.clone() as Arc<dyn Items>),
            engine,
        )
        .unwrap();
        let answer = registry
            .handle(
                put("gh", gh(), secrets(&[("GITHUB_TOKEN", token)])),
                "a test",
                |_| {},
            )
            .await;
        assert!(matches!(answer, RegistryAnswer::Done { .. }), "{answer:?}");
        desks.push((dir, registry, token));
    }
    for (_dir, registry, token) in &desks {
        let resolved = registry.resolve("gh").unwrap();
        let value = &resolved
            .values
            .iter()
            .find(|(k, _)| k == "GITHUB_TOKEN")
            .unwrap()
            .1;
        assert_eq!(value.as_str(), *token);
    }
}

#[tokio::test]
async fn new_names_stop_at_the_most_the_registry_keeps() {
    let f = fixture();
    let one = spec(json!({"command": ["x"]}));
    let mut servers = Servers::default();
    for i in 0..MAX_SERVERS {
        servers.servers.insert(format!("s{i}"), one.clone());
    }
    f.registry.write(SERVERS, &servers.text()).unwrap();
    let (answer, _) = ask(&f, put("one-more", one.clone(), secrets(&[]))).await;
    assert!(
        matches!(answer, RegistryAnswer::Refused { .. }),
        "{answer:?}"
    );
    // A registered name can still be changed (it asks the person).
    assert!(f.registry.servers().len() == MAX_SERVERS);
}

#[tokio::test]
async fn a_file_edit_is_shown_server_by_server_so_padding_cannot_hide_it() {
    let f = fixture();
    ask(&f, put("gh", gh(), secrets(&[("GITHUB_TOKEN", "t")]))).await;
    let path = f.dir.path().join("config/servers.json");
    // The changed command pushed far past what a window shows, behind spaces.
    let padding = " ".repeat(countersign_engine::MAX_CHANGE_TEXT_CHARS + 10);
    let edited = std::fs::read_to_string(&path).unwrap().replace(
        "\"gh-server\",",
        &format!("\"gh-server\",{padding}\"--evil\","),
    );
    std::fs::write(&path, &edited).unwrap();
    f.registry.check_files();
    pending_id(&f.engine).await;
    let request = &f.engine.pending()[0];
    let change = request.change().unwrap();
    let after = change.after.as_deref().unwrap();
    assert!(after.contains("command: gh-server --evil stdio"), "{after}");
    assert!(after.len() < 1000, "the padding is not shown");
    assert!(!change.summary.contains("not valid"), "{}", change.summary);
}

#[tokio::test]
async fn a_file_edit_too_large_to_show_whole_can_only_be_put_back() {
    let f = fixture();
    let path = f.dir.path().join("config/servers.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut servers = Servers::default();
    let big = "x".repeat(countersign_engine::MAX_CHANGE_TEXT_CHARS);
    servers.servers.insert(
        "big".into(),
        spec(json!({"command": ["x"], "env": {"PAD": big}})),
    );
    std::fs::write(&path, servers.text()).unwrap();
    f.registry.check_files();
    let id = pending_id(&f.engine).await;
    let summary = f.engine.pending()[0]
        .change()
        .as_ref()
        .unwrap()
        .summary
        .clone();
    assert!(summary.contains("larger than the desk shows"), "{summary}");
    f.engine.approve(id, None).await.unwrap();
    for _ in 0..100 {
        if std::fs::read_to_string(&path).unwrap() == Servers::default().text() {
            assert!(f.registry.servers().is_empty());
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the file was not put back");
}

#[tokio::test]
async fn a_registry_too_large_to_show_whole_is_refused() {
    let f = fixture();
    let big = "x".repeat(countersign_engine::MAX_CHANGE_TEXT_CHARS);
    let (answer, _) = ask(
        &f,
        put(
            "big",
            spec(json!({"command": ["x"], "env": {"PAD": big}})),
            secrets(&[]),
        ),
    )
    .await;
    assert!(
        matches!(answer, RegistryAnswer::Refused { .. }),
        "{answer:?}"
    );
    assert!(f.registry.servers().is_empty());
}

#[tokio::test]
async fn a_fifo_in_place_of_the_file_never_blocks_the_desk_and_is_replaced() {
    let f = fixture();
    ask(&f, put("gh", gh(), secrets(&[("GITHUB_TOKEN", "t")]))).await;
    let path = f.dir.path().join("config/servers.json");
    let accepted = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let registry = f.registry.clone();
    tokio::time::timeout(
        Duration::from_secs(5),
        tokio::task::spawn_blocking(move || registry.check_files()),
    )
    .await
    .expect("the check does not block on a FIFO")
    .unwrap();
    let id = pending_id(&f.engine).await;
    f.engine.deny(id, None).await.unwrap();
    for _ in 0..100 {
        // Read only once it is a file again: reading the FIFO would block the test.
        let is_file = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
        if is_file && std::fs::read_to_string(&path).unwrap() == accepted {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the file was not put back");
}

#[tokio::test]
async fn a_server_removed_by_an_approved_file_edit_takes_its_secrets_along() {
    let f = fixture();
    ask(&f, put("gh", gh(), secrets(&[("GITHUB_TOKEN", "t")]))).await;
    let path = f.dir.path().join("config/servers.json");
    std::fs::write(&path, Servers::default().text()).unwrap();
    f.registry.check_files();
    let id = pending_id(&f.engine).await;
    f.engine.approve(id, None).await.unwrap();
    let account = format!(
        "{}/server/gh/env/GITHUB_TOKEN",
        secrets::scope_of(&f.dir.path().join("data/desk.sqlite"))
    );
    for _ in 0..100 {
        if f.items.get(&account).unwrap().is_none() {
            // Named again by a later edit, it reaches no old value.
            assert!(f.registry.servers().is_empty());
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the secret of the removed server stayed in the keychain");
}

#[test]
fn a_value_with_a_line_break_cannot_forge_a_line_of_the_description() {
    let spec = spec(json!({"command": ["x"], "env": {"A": "1\nenv TOKEN = (secret, kept)"}}));
    let text = secrets::describe(&spec, &BTreeMap::new());
    assert_eq!(text.lines().count(), 2, "{text}");
}

#[tokio::test]
async fn a_backup_key_that_is_not_plain_is_refused() {
    let f = fixture();
    for key in ["", "a b", "../x", &"k".repeat(129)] {
        let (answer, _) = ask(
            &f,
            RegistryRequest::TakeBackup {
                key: key.to_owned(),
            },
        )
        .await;
        if key == "../x" {
            // Dots and slashes are plain; the key names a keychain item, never a path.
            assert!(
                matches!(answer, RegistryAnswer::Backup { .. }),
                "{answer:?}"
            );
        } else {
            assert!(
                matches!(answer, RegistryAnswer::Refused { .. }),
                "{key:?}: {answer:?}"
            );
        }
    }
}

/// The docs' example rules.
const EXAMPLE_RULES: &str = include_str!("../../cedar/policies/example.cedar");

/// The cvc5 executable the tests use: `CVC5`, or the one `.ci/setup tests` installs.
#[cfg(feature = "widening")]
fn test_solver() -> std::path::PathBuf {
    std::env::var_os("CVC5")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/peers/bin/cvc5")
        })
}

/// A server listing the built-in SQLite tools and a file writer, so that rules naming them load whole.
async fn list_sql_tools(engine: &Engine) {
    let sql =
        json!({"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]});
    let tenant = engine.connect(countersign_core::ServerId::Command("sql".into()));
    engine
        .register_tools(
            &tenant,
            vec![
                json!({"name": "query", "annotations": {"readOnlyHint": true}, "inputSchema": sql}),
                json!({"name": "execute", "annotations": {"destructiveHint": true}, "inputSchema": sql}),
                json!({"name": "write_file", "annotations": {"destructiveHint": true}, "inputSchema": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["path", "content"],
                }}),
            ],
        )
        .await
        .unwrap();
}

/// The change waiting for the person, once there is one.
async fn pending_change(engine: &Engine) -> countersign_engine::Change {
    pending_id(engine).await;
    engine.pending()[0].change().unwrap().clone()
}

#[tokio::test]
async fn rules_edited_behind_the_desks_back_wait_and_apply_only_after_approval() {
    let f = fixture();
    list_sql_tools(&f.engine).await;
    assert_eq!(
        f.registry.rules_text(),
        None,
        "no rules until there are some"
    );
    let path = f.dir.path().join("config/policy.cedar");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, EXAMPLE_RULES).unwrap();
    f.registry.check_files();
    let change = pending_change(&f.engine).await;
    assert_eq!(change.subject, "policy.cedar");
    assert_eq!(
        change.summary,
        "apply policy.cedar as edited outside the desk"
    );
    // What it does is said beside the text: proved, found, or plainly not known.
    let analysis = change.analysis.clone().unwrap();
    assert!(
        analysis.starts_with("It widens") || analysis.starts_with("What it changes is not known ("),
        "{analysis}"
    );
    assert!(
        f.engine.rules().is_none(),
        "nothing in force before the click"
    );
    f.engine
        .approve(f.engine.pending()[0].id, None)
        .await
        .unwrap();
    for _ in 0..200 {
        if f.registry.rules_text().as_deref() == Some(EXAMPLE_RULES) && f.engine.rules().is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the approved rules were not put in force");
}

#[tokio::test]
async fn rules_that_do_not_load_are_shown_as_invalid_with_their_line_and_never_applied() {
    let f = fixture();
    list_sql_tools(&f.engine).await;
    let path = f.dir.path().join("config/policy.cedar");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let bad = "// opens every SQL call\n@class(\"open\")\npermit (principal, action == Countersign::Action::\"execute\", resource)\nwhen { context.arguments.table == \"x\" };\n";
    std::fs::write(&path, bad).unwrap();
    f.registry.check_files();
    let change = pending_change(&f.engine).await;
    assert!(change.summary.contains("not valid"), "{}", change.summary);
    assert!(change.summary.contains("line 2"), "{}", change.summary);
    assert!(
        change.summary.contains("policy_invalid"),
        "{}",
        change.summary
    );
    assert_eq!(
        change.analysis, None,
        "nothing is analysed of rules that do not load"
    );
    // Approve only puts back what applies (nothing).
    f.engine
        .approve(f.engine.pending()[0].id, None)
        .await
        .unwrap();
    for _ in 0..200 {
        if std::fs::read_to_string(&path).unwrap().is_empty() {
            assert!(f.engine.rules().is_none());
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the invalid rules were not put back");
}

#[cfg(feature = "widening")]
#[tokio::test]
#[ignore = "needs cvc5: `.ci/setup tests` installs it (the test command runs ignored tests)"]
async fn a_rules_change_is_said_as_the_calls_it_opens_or_proved_to_only_tighten() {
    let f = fixture();
    list_sql_tools(&f.engine).await;
    let solver = test_solver();
    let limit = Duration::from_secs(120);
    let strict = "@class(\"once\")\npermit (principal, action, resource);";
    let said = |before: &str, after: &str| {
        let (old, new) = (
            f.engine.load_rules(before).unwrap(),
            f.engine.load_rules(after).unwrap(),
        );
        let solver = solver.clone();
        async move { rules::said(&countersign_cedar::widening(&old, &new, &solver, limit).await) }
    };
    let widened = said(strict, EXAMPLE_RULES).await;
    assert!(widened.starts_with("It widens"), "{widened}");
    assert!(widened.contains("execute with"), "{widened}");
    assert!(widened.contains("would run without a click"), "{widened}");
    let tightened = said(EXAMPLE_RULES, &format!("{EXAMPLE_RULES}\n{strict}")).await;
    assert!(
        tightened.starts_with("Proved by the solver: it only tightens"),
        "{tightened}"
    );
    // No solver: said plainly, never a proof.
    let (old, new) = (
        f.engine.load_rules(EXAMPLE_RULES).unwrap(),
        f.engine.load_rules(strict).unwrap(),
    );
    let missing = std::path::Path::new("/nonexistent/cvc5");
    let unknown = rules::said(&countersign_cedar::widening(&old, &new, missing, limit).await);
    assert!(
        unknown.starts_with("What it changes is not known (solver_missing"),
        "{unknown}"
    );
}
