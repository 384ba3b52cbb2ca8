//! `countersign clients` as a person runs it: the real binary, a home of its own (`$HOME`), no
//! desk at all (the command only reads).

use std::process::Command;

#[test]
fn clients_reads_the_home_and_needs_no_desk() {
    let home = tempfile::tempdir().unwrap();
    let goose = home.path().join(".config/goose/config.yaml");
    std::fs::create_dir_all(goose.parent().unwrap()).unwrap();
    std::fs::write(
        &goose,
        "# mine\nextensions:\n  github:\n    name: github\n    cmd: github-mcp-server\n    envs:\n      GITHUB_TOKEN: ghp_cliFixture0001\n    type: stdio\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_countersign"))
        .arg("clients")
        .env("HOME", home.path())
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("CODEX_HOME")
        // No desk answers here; the command must not need one.
        .env("COUNTERSIGN_SOCKET", home.path().join("no-desk.sock"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Goose (goose): "), "{stdout}");
    assert!(
        stdout.contains(
            "NOT protected: 1 of 1 servers to protect (`countersign install --client goose`)"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("Not found on this machine: Claude Desktop,"),
        "{stdout}"
    );
    assert!(!stdout.contains("ghp_cliFixture0001"), "{stdout}");
    assert!(!home.path().join("no-desk.sock").exists());
}

#[test]
fn install_needs_a_client_or_all_and_not_both() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_countersign"))
            .args(args)
            .output()
            .unwrap()
    };
    let neither = run(&["install"]);
    assert_eq!(neither.status.code(), Some(2));
    let both = run(&["install", "--all", "--client", "cursor"]);
    assert_eq!(both.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used with"));
    let all_with_file = run(&["install", "--all", "--config", "/tmp/x.json"]);
    assert_eq!(all_with_file.status.code(), Some(2));
}
