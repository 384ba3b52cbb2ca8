//! The JSON clients (all but Codex): their files read and edited as JSON with comments, through
//! `jsonc-parser`'s concrete syntax tree, so that what install does not touch stays byte for
//! byte (VS Code's and Zed's files carry comments and trailing commas; Claude Code's
//! `~/.claude.json` carries much else the client owns).
//!
//! The shapes differ a little (each client's is its row of [`crate::table`]): VS Code wants
//! `"type": "stdio"`; Windsurf calls a URL `serverUrl`, Gemini `httpUrl` (and `url` is SSE
//! there); Zed's entries may be `{"command": {"path", "args", "env"}}` (its older shape) or come
//! from an extension, with no command at all; OpenCode's command is one list, program first,
//! beside `environment` and `"type": "local"`. An entry keeps every key that is about how the client uses a server
//! (`disabled`, `timeout`, `trust`, and the client's own prompt settings such as Cline's list of
//! tools it runs without asking its user) and loses those about how to reach it. Those client
//! settings decide only whether the client asks its own user; Countersign never reads them, and
//! a gated tool still needs the click in the desk whatever the client's config says.

use jsonc_parser::common::Ranged;
use jsonc_parser::cst::{CstInputValue, CstObject, CstObjectProp, CstRootNode};
use jsonc_parser::{CollectOptions, ParseOptions, ast};
use serde_json::{Map, Value};

use super::{
    Client, EntryAt, FIX_BY_HAND, Found, Leave, Reach, gateway_args, is_wrapped, server_of,
};
use crate::error::{EditError, ParseError, PutBackError};
use crate::undo::Piece;

/// Keys that say how a client reaches a server: the rewritten entry loses them (the desk has
/// them now), except `command`, `args` and `type`, which are set.
const REACH_KEYS: [&str; 8] = [
    "env",
    "cwd",
    "url",
    "serverUrl",
    "httpUrl",
    "headers",
    "transportType",
    "envFile",
];

/// Keys that mean the client itself signs in to the server (OAuth): the desk cannot.
const SIGN_IN_KEYS: [&str; 2] = ["oauth", "authProviderType"];

/// The next move for an SSE server.
pub(crate) const SSE_NEXT: &str = "if the server also has a streamable HTTP address, put that in \
     the entry and run install again; else keep it as it is";

/// The next move for a server the client signs in to.
pub(crate) const SIGN_IN_NEXT: &str = "keep it as it is, or register the server with \
     `countersign server add` and a token header if it accepts one";

fn parse(text: &str) -> Result<CstRootNode, ParseError> {
    // Its error says the kind and the place only, never the text (which could hold a secret).
    CstRootNode::parse(text, &ParseOptions::default()).map_err(ParseError::Json)
}

/// The objects of entries in the file, with the keys leading to each.
fn server_objects(client: Client, root: &CstRootNode) -> Vec<(Vec<String>, CstObject)> {
    let mut found = Vec::new();
    let Some(top) = root.object_value() else {
        return found;
    };
    for pattern in client.spec().servers_at {
        let mut level = vec![(Vec::new(), top.clone())];
        for segment in *pattern {
            let mut next = Vec::new();
            for (path, object) in level {
                if *segment == "*" {
                    for prop in object.properties() {
                        if let (Some(name), Some(inner)) =
                            (prop.decoded_name(), prop.object_value())
                        {
                            let mut p = path.clone();
                            p.push(name);
                            next.push((p, inner));
                        }
                    }
                } else if let Some(inner) = object.object_value(segment) {
                    let mut p = path.clone();
                    p.push((*segment).to_owned());
                    next.push((p, inner));
                }
            }
            level = next;
        }
        found.extend(level);
    }
    found
}

/// Every entry of the file and what it is.
pub(super) fn entries(client: Client, text: &str) -> Result<Vec<(EntryAt, Found)>, ParseError> {
    let root = parse(text)?;
    let mut out = Vec::new();
    let patterns = client.spec().servers_at;
    for (parents, object) in server_objects(client, &root) {
        for prop in object.properties() {
            let Some(key) = prop.decoded_name() else {
                continue;
            };
            // OpenCode's `mcp.servers` holds entries; under `mcp` it is not one.
            if holds_entries(patterns, &parents, &key) {
                continue;
            }
            let at = EntryAt {
                parents: parents.clone(),
                key,
            };
            let found = match prop.value().and_then(|v| v.to_serde_value()) {
                Some(Value::Object(entry)) => read_entry(client, &entry),
                _ => Found::Left(Leave::then("it is not an object", FIX_BY_HAND)),
            };
            out.push((at, found));
        }
    }
    Ok(out)
}

/// Whether `parents.key` is itself where entries are (one pattern is another's prefix).
fn holds_entries(patterns: &[&[&str]], parents: &[String], key: &str) -> bool {
    patterns.iter().any(|p| {
        p.len() == parents.len() + 1
            && p[parents.len()] == key
            && p.iter().zip(parents).all(|(a, b)| *a == "*" || a == b)
    })
}

fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        // Some configs write a port or a flag unquoted; the client passes it on as text.
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn strings(value: Option<&Value>) -> Option<Vec<String>> {
    match value {
        None => Some(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(text_of).collect(),
        Some(_) => None,
    }
}

fn pairs(value: Option<&Value>) -> Option<Vec<(String, String)>> {
    match value {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| Some((k.clone(), text_of(v)?)))
            .collect(),
        Some(_) => None,
    }
}

/// The environment of an entry: as [`pairs`], but where `client` reads `null` as "the variable
/// of the same name" (MCPHub), `null` is read as the empty value it means there, which
/// [`server_of`] leaves to the person.
fn env_pairs(client: Client, value: Option<&Value>) -> Option<Vec<(String, String)>> {
    match value {
        Some(Value::Object(map)) if client.spec().expansion.empty => map
            .iter()
            .map(|(k, v)| match v {
                Value::Null => Some((k.clone(), String::new())),
                v => Some((k.clone(), text_of(v)?)),
            })
            .collect(),
        _ => pairs(value),
    }
}

fn read_entry(client: Client, entry: &Map<String, Value>) -> Found {
    let shape = client.spec().shape;
    let str_of = |key: &str| entry.get(key).and_then(Value::as_str);
    let transport = str_of("type").or(str_of("transportType"));
    // Zed's older shape: `"command": {"path": ..., "args": [...], "env": {...}}`.
    let nested = entry.get(shape.command).and_then(Value::as_object);
    // OpenCode's: `"command": ["program", "arg", ...]`.
    let argv = entry
        .get(shape.command)
        .and_then(Value::as_array)
        .filter(|_| shape.argv);
    let program = match (nested, argv) {
        (Some(command), _) => command.get("path").and_then(Value::as_str),
        (None, Some(argv)) => argv.first().and_then(Value::as_str),
        (None, None) => str_of(shape.command),
    };
    if let Some(program) = program {
        let (args, env) = match (nested, argv) {
            (Some(command), _) => (
                strings(command.get("args")),
                env_pairs(client, command.get("env")),
            ),
            (None, Some(argv)) => (
                argv[1..].iter().map(text_of).collect(),
                env_pairs(client, entry.get(shape.env)),
            ),
            (None, None) => (
                strings(entry.get("args")),
                env_pairs(client, entry.get(shape.env)),
            ),
        };
        let (Some(args), Some(env)) = (args, env) else {
            return Found::Left(Leave::then(
                format!("its `args` or `{}` is not what the client reads", shape.env),
                FIX_BY_HAND,
            ));
        };
        if is_wrapped(program, &args) {
            return Found::Wrapped;
        }
        if entry.contains_key("envFile") {
            return Found::Left(
                "it reads environment variables from `envFile`, which only the client loads; \
                 register it with `countersign server add` instead"
                    .into(),
            );
        }
        let cwd = match entry.get("cwd") {
            None => None,
            Some(Value::String(cwd)) => Some(cwd.clone()),
            Some(_) => return Found::Left(Leave::then("its `cwd` is not text", FIX_BY_HAND)),
        };
        return server_of(
            client,
            Reach::Command {
                program: program.to_owned(),
                args,
                cwd,
                env,
            },
        );
    }
    let url_key = shape.url_keys.iter().find(|k| entry.contains_key(**k));
    if let Some(&url_key) = url_key {
        let Some(url) = str_of(url_key) else {
            return Found::Left(Leave::then(
                format!("its `{url_key}` is not text"),
                FIX_BY_HAND,
            ));
        };
        let sse = transport == Some("sse") || (shape.url_is_sse && url_key == "url");
        if sse {
            return Found::Left(Leave::then(
                "it is an SSE server, and the desk reaches streamable HTTP servers only",
                SSE_NEXT,
            ));
        }
        if let Some(key) = SIGN_IN_KEYS.iter().find(|k| entry.contains_key(**k)) {
            return Found::Left(Leave::then(
                format!(
                    "{} signs in to it itself (`{key}`), and the desk cannot hold that sign-in",
                    client.title()
                ),
                SIGN_IN_NEXT,
            ));
        }
        let Some(headers) = pairs(entry.get("headers")) else {
            return Found::Left(Leave::then(
                "its `headers` is not an object of text",
                FIX_BY_HAND,
            ));
        };
        return server_of(
            client,
            Reach::Url {
                url: url.to_owned(),
                headers,
            },
        );
    }
    Found::Left(shape.without_command.into())
}

fn text_array(items: &[String]) -> CstInputValue {
    CstInputValue::Array(
        items
            .iter()
            .map(|s| CstInputValue::String(s.clone()))
            .collect(),
    )
}

/// The entry object at `at`, if the file still has it.
fn entry_object(client: Client, root: &CstRootNode, at: &EntryAt) -> Option<CstObject> {
    server_objects(client, root)
        .into_iter()
        .find(|(path, _)| *path == at.parents)?
        .1
        .object_value(&at.key)
}

/// The file with each entry in `names` rewritten to `program mcp --server NAME`.
pub(super) fn rewrite(
    client: Client,
    text: &str,
    names: &[(EntryAt, String)],
    program: &str,
) -> Result<String, EditError> {
    let root = parse(text)?;
    for (at, name) in names {
        let entry =
            entry_object(client, &root, at).ok_or_else(|| EditError::Gone { at: at.clone() })?;
        rewrite_entry(client, &entry, program, &gateway_args(name));
    }
    Ok(root.to_string())
}

fn rewrite_entry(client: Client, entry: &CstObject, program: &str, args: &[String]) {
    let shape = client.spec().shape;
    let command = entry.get(shape.command);
    let nested = command.as_ref().and_then(CstObjectProp::object_value);
    if let Some(nested) = nested {
        // Zed's older shape stays that shape.
        set_or_insert(&nested, "path", 0, program.into());
        set_or_insert(&nested, "args", 1, text_array(args));
        if let Some(env) = nested.get("env") {
            env.remove();
        }
    } else {
        // Where the command goes: where it was, or where the URL was, or first.
        let at = command
            .as_ref()
            .or(shape.url_keys.iter().find_map(|k| entry.get(k)).as_ref())
            .map_or(0, CstObjectProp::property_index);
        if shape.argv {
            let mut argv = vec![program.to_owned()];
            argv.extend_from_slice(args);
            set_or_insert(entry, shape.command, at, text_array(&argv));
            if let Some(args) = entry.get("args") {
                args.remove();
            }
        } else {
            let command = set_or_insert(entry, shape.command, at, program.into());
            set_or_insert(
                entry,
                "args",
                command.property_index() + 1,
                text_array(args),
            );
        }
    }
    for key in REACH_KEYS.into_iter().chain([shape.env]) {
        if let Some(prop) = entry.get(key) {
            prop.remove();
        }
    }
    match entry.get("type") {
        Some(kind) => {
            let is_stdio = kind
                .value()
                .and_then(|v| v.as_string_lit())
                .and_then(|s| s.decoded_value().ok())
                .is_some_and(|v| shape.stdio.contains(&v.as_str()));
            if !is_stdio {
                kind.set_value(shape.stdio[0].into());
            }
        }
        // VS Code reads `type` first; the others take an entry with a command as stdio.
        None if shape.needs_type => {
            entry.insert(0, "type", shape.stdio[0].into());
        }
        None => {}
    }
}

/// Sets `key` to `value` where it is, or inserts it at `index`.
fn set_or_insert(
    object: &CstObject,
    key: &str,
    index: usize,
    value: CstInputValue,
) -> CstObjectProp {
    match object.get(key) {
        Some(prop) => {
            prop.set_value(value);
            prop
        }
        None => object.insert(index, key, value),
    }
}

/// Where each entry's value is in `text`, for uninstall: one piece per entry.
pub(super) fn pieces(client: Client, text: &str) -> Result<Vec<(EntryAt, Vec<Piece>)>, ParseError> {
    let parsed =
        jsonc_parser::parse_to_ast(text, &CollectOptions::default(), &ParseOptions::default())
            .map_err(ParseError::Json)?;
    let mut out = Vec::new();
    let Some(ast::Value::Object(top)) = parsed.value else {
        return Ok(out);
    };
    let patterns = client.spec().servers_at;
    for pattern in patterns {
        let mut level: Vec<(Vec<String>, &ast::Object)> = vec![(Vec::new(), &top)];
        for segment in *pattern {
            let mut next = Vec::new();
            for (path, object) in level {
                for prop in &object.properties {
                    let name = prop.name.as_str();
                    if let ast::Value::Object(inner) = &prop.value
                        && (*segment == "*" || *segment == name)
                    {
                        let mut p = path.clone();
                        p.push(name.to_owned());
                        next.push((p, inner));
                    }
                }
            }
            level = next;
        }
        for (parents, object) in level {
            for prop in &object.properties {
                let key = prop.name.as_str();
                if holds_entries(patterns, &parents, key) {
                    continue;
                }
                let at = EntryAt {
                    parents: parents.clone(),
                    key: key.to_owned(),
                };
                let range = prop.value.range();
                out.push((
                    at,
                    vec![Piece {
                        id: String::new(),
                        range: range.start..range.end,
                    }],
                ));
            }
        }
    }
    Ok(out)
}

/// The file as data, for uninstall to compare.
pub(super) fn plain(text: &str) -> Result<Value, ParseError> {
    Ok(parse(text)?
        .value()
        .and_then(|v| v.to_serde_value())
        .unwrap_or(Value::Null))
}

/// `text` with the gone entry `at` back as `null` at the end of its object of entries, for
/// uninstall to put the original's text in; an error when that object is gone too.
pub(super) fn place(client: Client, text: &str, at: &EntryAt) -> Result<String, PutBackError> {
    let root = parse(text).map_err(PutBackError::Parse)?;
    let object = server_objects(client, &root)
        .into_iter()
        .find(|(path, _)| *path == at.parents)
        .map(|(_, object)| object)
        .ok_or(PutBackError::GoneWithItsObject)?;
    object.append(&at.key, CstInputValue::Null);
    Ok(root.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrap(client: Client, text: &str, key: &str) -> String {
        let at = EntryAt {
            parents: client.spec().servers_at[0]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            key: key.into(),
        };
        rewrite(client, text, &[(at, key.to_owned())], "countersign").unwrap()
    }

    #[test]
    fn an_entry_written_on_one_line_is_rewritten_and_its_neighbours_kept() {
        let text = "{\"mcpServers\": {\"a\": {\"url\": \"https://e.com/mcp\", \"headers\": {\"K\": \"v\"}, \"disabled\": true}, \"b\": {\"command\": \"x\"}}}\n";
        let out = wrap(Client::Cursor, text, "a");
        let value: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"mcpServers": {
                "a": {"command": "countersign", "args": ["mcp", "--server", "a"], "disabled": true},
                "b": {"command": "x"}
            }})
        );
        assert!(out.ends_with("}\n"), "{out}");
    }

    #[test]
    fn comments_outside_the_removed_keys_stay() {
        let text = "{\n  \"servers\": {\n    // mine\n    \"a\": {\n      \"command\": \"x\", // the old one\n      \"env\": {\"T\": \"v\"}\n    }\n  }\n}\n";
        let out = wrap(Client::Vscode, text, "a");
        assert!(out.contains("// mine"), "{out}");
        assert!(!out.contains("\"v\""), "{out}");
        let value = parse(&out)
            .unwrap()
            .value()
            .unwrap()
            .to_serde_value()
            .unwrap();
        assert_eq!(value["servers"]["a"]["type"], "stdio");
    }

    #[test]
    fn opencode_jsonc_keeps_comments_and_trailing_commas_around_the_entry() {
        let text = "{\n  // mine\n  \"$schema\": \"https://opencode.ai/config.json\",\n  \"mcp\": {\n    /* block */\n    \"github\": {\n      \"type\": \"local\",\n      \"command\": [\"npx\", \"-y\", \"x\"], // argv\n      \"environment\": {\"T\": \"sk_jsonc1\",},\n    },\n    \"other\": {\"type\": \"remote\", \"url\": \"https://e.com/mcp\",},\n  },\n}\n";
        // The first version of OpenCode's config: entries straight under `mcp`.
        let at = EntryAt {
            parents: vec!["mcp".into()],
            key: "github".into(),
        };
        let out = rewrite(
            Client::Opencode,
            text,
            &[(at, "github".into())],
            "countersign",
        )
        .unwrap();
        assert!(out.starts_with("{\n  // mine\n"), "{out}");
        assert!(out.contains("/* block */"), "{out}");
        assert!(
            out.contains(
                "\"other\": {\"type\": \"remote\", \"url\": \"https://e.com/mcp\",},\n  },\n}\n"
            ),
            "{out}"
        );
        assert!(!out.contains("sk_jsonc1"), "{out}");
        let value = parse(&out)
            .unwrap()
            .value()
            .unwrap()
            .to_serde_value()
            .unwrap();
        assert_eq!(
            value["mcp"]["github"]["command"],
            serde_json::json!(["countersign", "mcp", "--server", "github"])
        );
    }

    #[test]
    fn amp_jsonc_with_a_dotted_key_keeps_its_comments() {
        let text = "{\n  \"amp.showCosts\": false, // hush\n  \"amp.mcpServers\": {\n    // mine\n    \"linear\": {\"command\": \"npx\", \"env\": {\"T\": \"sk_jsonc2\"},},\n  },\n}\n";
        let out = wrap(Client::Amp, text, "linear");
        assert!(
            out.starts_with("{\n  \"amp.showCosts\": false, // hush\n"),
            "{out}"
        );
        assert!(out.contains("    // mine\n"), "{out}");
        assert!(out.ends_with("  },\n}\n"), "{out}");
        assert!(!out.contains("sk_jsonc2"), "{out}");
        let value = parse(&out)
            .unwrap()
            .value()
            .unwrap()
            .to_serde_value()
            .unwrap();
        assert_eq!(value["amp.mcpServers"]["linear"]["command"], "countersign");
    }

    #[test]
    fn a_variable_mcphub_fills_in_itself_is_left() {
        for env in [
            "{\"T\": \"\"}",
            "{\"T\": \"$: cmd:op read op://v/t\"}",
            "{\"T\": \"${T}\"}",
            "{\"T\": null}",
        ] {
            let text =
                format!("{{\"mcpServers\": {{\"a\": {{\"command\": \"x\", \"env\": {env}}}}}}}");
            let found = entries(Client::Mcphub, &text).unwrap();
            assert!(matches!(found[0].1, Found::Left(_)), "{env} was taken over");
        }
        // The same empty value elsewhere is a value.
        let text = "{\"mcpServers\": {\"a\": {\"command\": \"x\", \"env\": {\"T\": \"\"}}}}";
        let found = entries(Client::Cursor, text).unwrap();
        assert!(matches!(found[0].1, Found::Server(_)));
    }
}
