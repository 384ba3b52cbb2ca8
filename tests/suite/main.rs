//! Countersign's cross-crate and multi-process tests: the real desk and window, the real keychain,
//! real SQLite files and a throwaway PostgreSQL, real MCP peers and clients, `countersign serve` as a
//! process. One binary, one module per concern; the helpers they share are the `countersign_tests`
//! library beside it (`src/`), and the programs they spawn its binaries.

/// An agent under an account of its own (root: a fresh account): served only when the desk's
/// settings list it, and then only for a URL or a registered server.
mod accounts;
/// The desk killed with SIGKILL at random moments along the approval flow (200 trials), with a
/// real upstream counting what it executes: at most once, never unapproved, the store always opens.
mod crashes;
/// The desk's real window under Xvfb, driven through WebDriver (tauri-driver + WebKitWebDriver),
/// with a real MCP client talking to a real `countersign mcp` on the other side.
mod desk;
/// The documentation leads somewhere: the README's and docs/'s relative links and anchors, and the
/// documents and sections code comments cite.
mod docs;
/// The engine with its records on PostgreSQL: approve, confirm once, refusals, a spend cut mid-way
/// (run under .ci/with-postgres).
mod engine_postgres;
/// Grants through the real window: Approve and grant makes the second identical call pass without
/// a click, Revoke in the Grants view makes the next one wait, a destructive tool is offered none.
mod grants;
/// The desk with no display: no window, open tools work, gated calls are desk_unavailable; a
/// gateway with no display starts it that way, in the account's own home whatever the agent's
/// environment says (root: a fresh account); its log file; a socket directory others control.
mod headless;
/// `countersign install` and `uninstall` end to end on Claude Desktop and Codex configurations
/// with tokens: the real desk, window and keychain; tokens in no file, servers reached through the
/// desk with their tokens, the original restored byte for byte.
mod install;
/// The keychain taken away while the desk runs (a private Secret Service): Approve stops with a
/// banner, tokens already minted still confirm.
mod keychain;
/// Corrupt file, unopenable path, a lock held past the timeout, the file-size limit.
mod ledger_faults;
/// The PostgreSQL ledger under races and faults: 64 processes on one nonce, a server stopped, a
/// connection cut after the INSERT was sent, serialization failures, a frozen backend.
mod ledger_postgres;
/// 64 processes spending one nonce at the same moment, on an existing file and on a new one.
mod ledger_race;
/// Confirm events sent to an OpenTelemetry collector the test runs: once each, in order, none lost.
mod otlp;
/// Every behaviour of the records, against SQLite and against PostgreSQL (those ignored unless
/// run under .ci/with-postgres).
mod records;
/// Servers registered in the desk: `countersign server` against the real desk, window and
/// keychain; a change from the command line or an edit of servers.json waits for the click, and
/// secret values reach the upstream and no file.
mod registry;
/// The .deb's contents, and a release desk refusing WebDriver, not dumpable, and opening no
/// inspector port whatever its environment says (after .ci/release).
mod release;
/// The MCP 2026-07-28 flow through the real window: the Python SDK's client answered input_required,
/// its elicitation callback waiting while the test clicks Approve, its own retry with the
/// requestState running the call; a legacy client beside it keeps the preflight/confirm text flow.
mod rounds;
/// Secrets never leak: a whole session through the real desk and window (approve, confirm, deny,
/// replay, rotate from the settings view), then every file the desk wrote, its stderr and the
/// gateway's, and the Debug of every wire type, scanned for the secret, the tokens and an upstream
/// credential, in every spelling.
mod secrets;
/// `countersign serve` as a process: start rules, read-only and writable serving, HTTP edges, TLS,
/// the approver protocol as documented, replicas killed and restarted while a call waits.
mod serve;
/// Settings → Servers and Settings → Clients in the real window: a server added through the form
/// with its secret masked and in no file, edits that keep what they do not show, Protect and
/// Restore of a client's configuration.
mod settings;
