//! The YAML clients (Goose's `extensions:` map, Continue's `mcpServers:` list), read and edited
//! through `yaml-edit`'s lossless rowan tree.
//!
//! Why `yaml-edit`: it is the one Rust YAML library that parses into a tree holding every byte
//! of the file (comments, blank lines, anchors, quoting, indentation) and edits that tree in
//! place; it runs the YAML test suite and property tests that an edit changes nothing but what
//! it touches, has no C or unsafe parser under it, and is released often. `yamlpatch` (zizmor's)
//! is also careful, but it locates through tree-sitter (a C grammar, and a newer compiler than
//! ours); `serde_yaml` and `saphyr` re-serialize, losing every comment.
//!
//! A library is still not trusted blindly, because the file is the person's own. So:
//! - a file whose tree does not print back byte for byte, or that holds errors or more than one
//!   document, is refused before anything is read from it;
//! - an entry that uses an anchor, an alias, a merge key (`<<`) or a tag is left as it is:
//!   rewriting it could change other entries through the alias, and its values are not plain;
//! - each entry is edited on its own, and the file before and after must be identical outside
//!   the byte range of that entry's value; the edit is refused otherwise;
//! - the result must read back as `countersign mcp` (checked by `install::plan` for every
//!   format).
//!
//! An entry keeps what is about how the client uses the server (Goose's `enabled`, `timeout`,
//! `description`; Continue's `name`) and loses what is about how to reach it.

use std::collections::BTreeMap;

use yaml_edit::{Mapping, YamlFile, YamlNode, YamlValue};

use super::table::Layout;
use super::{
    Client, EntryAt, FIX_BY_HAND, Found, Leave, Reach, gateway_args, is_wrapped, server_of,
};
use crate::error::{EditError, ParseError};
use crate::json::SSE_NEXT;
use crate::undo::Piece;

/// Keys that say how a client reaches a server: the rewritten entry loses them (besides the
/// client's own environment key).
const REACH_KEYS: [&str; 4] = ["cwd", "headers", "requestOptions", "env_keys"];

/// A value as read from the file: plain text, a mapping, a list, or something that is not
/// plain (an alias, a tagged node).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Plain {
    Text(String),
    Null,
    Map(Vec<(String, Plain)>),
    List(Vec<Plain>),
    Opaque,
}

impl Plain {
    fn get(&self, key: &str) -> Option<&Plain> {
        match self {
            Plain::Map(pairs) => pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn text(&self) -> Option<&str> {
        match self {
            Plain::Text(t) => Some(t),
            _ => None,
        }
    }

    /// A key that one mapping of the value holds twice, at any depth.
    fn twice(&self) -> Option<&str> {
        match self {
            Plain::Map(pairs) => pairs
                .iter()
                .enumerate()
                .find(|(i, (k, _))| pairs[..*i].iter().any(|(seen, _)| seen == k))
                .map(|(_, (k, _))| k.as_str())
                .or_else(|| pairs.iter().find_map(|(_, v)| v.twice())),
            Plain::List(items) => items.iter().find_map(Plain::twice),
            _ => None,
        }
    }

    fn is_plain(&self) -> bool {
        match self {
            Plain::Opaque => false,
            Plain::Map(pairs) => pairs.iter().all(|(k, v)| k != "<<" && v.is_plain()),
            Plain::List(items) => items.iter().all(Plain::is_plain),
            Plain::Text(_) | Plain::Null => true,
        }
    }
}

fn plain(node: &YamlNode) -> Plain {
    match node {
        YamlNode::Scalar(s) if s.is_null() => Plain::Null,
        YamlNode::Scalar(s) => Plain::Text(s.as_string()),
        YamlNode::Mapping(m) => Plain::Map(
            m.iter()
                .map(|(k, v)| {
                    let key = match &k {
                        YamlNode::Scalar(s) => s.as_string(),
                        _ => "<<".into(), // a key that is not text: never plain
                    };
                    (key, plain(&v))
                })
                .collect(),
        ),
        YamlNode::Sequence(s) => Plain::List(s.values().map(|v| plain(&v)).collect()),
        YamlNode::Alias(_) | YamlNode::TaggedNode(_) => Plain::Opaque,
    }
}

/// Larger than any client's configuration; the tree of a larger file takes seconds to build,
/// once for every entry rewritten.
const MAX_BYTES: usize = 1 << 20;

fn parse(text: &str) -> Result<YamlFile, ParseError> {
    if text.len() > MAX_BYTES {
        return Err(ParseError::YamlTooLarge { limit: MAX_BYTES });
    }
    // YAML forbids tabs in indentation; the tree reads such a file anyway, and an entry
    // rewritten beside tab-indented lines would be indented differently from its neighbours.
    if let Some(line) = text.lines().position(|l| {
        l.starts_with([' ', '\t']) && l[..l.len() - l.trim_start().len()].contains('\t')
    }) {
        return Err(ParseError::YamlTab { line: line + 1 });
    }
    let parsed = YamlFile::parse(text);
    if let Some(e) = parsed.positioned_errors().first() {
        // The line only: the parser's message may quote the text, which may be a secret.
        let start = (e.range.start as usize).min(text.len());
        let line = text.as_bytes()[..start]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            + 1;
        return Err(ParseError::Yaml { line });
    }
    let file = parsed.tree();
    if file.to_string() != text {
        return Err(ParseError::YamlNotKept);
    }
    match file.documents().count() {
        0 | 1 => Ok(file),
        documents => Err(ParseError::YamlDocuments { documents }),
    }
}

/// The node holding the entries (`extensions:` or `mcpServers:`), if the file has one, and
/// where the text before it starts (its key, where an anchor on it would stand).
fn container(client: Client, file: &YamlFile) -> Option<(YamlNode, usize)> {
    let doc = file.documents().next()?;
    let mut node = YamlNode::Mapping(doc.as_mapping()?);
    let mut before = 0;
    for key in client.spec().servers_at[0] {
        let (k, v) = node
            .as_mapping()?
            .iter()
            .find(|(k, _)| k.as_scalar().is_some_and(|s| s.as_string() == *key))?;
        before = k.byte_range().start as usize;
        node = v;
    }
    Some((node, before))
}

/// Whether the entries' mapping carries an anchor: an alias elsewhere would repeat every entry.
fn container_anchored(client: Client, text: &str, file: &YamlFile) -> bool {
    container(client, file).is_some_and(|(node, before)| anchored(text, before, &node))
}

/// Every entry: where it is, its value, and where the text before its value starts (its key,
/// or the end of the list item before it), where an anchor would stand.
fn each_entry(client: Client, file: &YamlFile) -> Vec<(EntryAt, YamlNode, usize)> {
    let spec = client.spec();
    let parents: Vec<String> = spec.servers_at[0].iter().map(|s| s.to_string()).collect();
    let at = |key: String| EntryAt {
        parents: parents.clone(),
        key,
    };
    let Some((node, _)) = container(client, file) else {
        return Vec::new();
    };
    match spec.layout {
        Layout::ByName => match node.as_mapping() {
            Some(map) => map
                .iter()
                .map(|(k, v)| {
                    let key = k.as_scalar().map(|s| s.as_string()).unwrap_or_default();
                    let before = k.byte_range().start as usize;
                    (at(key), v, before)
                })
                .collect(),
            None => Vec::new(),
        },
        Layout::List(name_key) => match node.as_sequence() {
            Some(list) => {
                let mut before = node.byte_range().start as usize;
                let mut out = Vec::new();
                for (i, v) in list.values().enumerate() {
                    let name = v
                        .as_mapping()
                        .and_then(|m| m.get(name_key))
                        .and_then(|n| n.as_scalar().map(|s| s.as_string()))
                        .unwrap_or_else(|| format!("#{}", i + 1));
                    let end = v.byte_range().end as usize;
                    out.push((at(name), v, before));
                    before = end;
                }
                out
            }
            None => Vec::new(),
        },
    }
}

/// Whether an anchor (`&name`) stands before the entry's value, outside comments: other places
/// may repeat the entry through an alias.
fn anchored(text: &str, before: usize, value: &YamlNode) -> bool {
    let start = (value.byte_range().start as usize).min(text.len());
    text.get(before.min(start)..start)
        .unwrap_or_default()
        .lines()
        .any(|line| line.split('#').next().unwrap_or_default().contains('&'))
}

/// Every entry of the file and what it is.
pub(super) fn entries(client: Client, text: &str) -> Result<Vec<(EntryAt, Found)>, ParseError> {
    let file = parse(text)?;
    let shared = container_anchored(client, text, &file);
    let mut seen = BTreeMap::new();
    let mut out = Vec::new();
    for (at, node, before) in each_entry(client, &file) {
        let count = seen.entry(at.key.clone()).or_insert(0);
        *count += 1;
        let found = if shared {
            Found::Left(Leave::then(
                "the mapping of all the entries carries a YAML anchor (`&`), so other places may \
                 repeat them through an alias",
                "write the entries out without the anchor, then run install again",
            ))
        } else if *count > 1 {
            Found::Left(Leave::then(
                "another entry has the same name, so which one is meant is not clear",
                "give each entry its own name, then run install again",
            ))
        } else if anchored(text, before, &node) {
            Found::Left(Leave::then(
                "it carries a YAML anchor (`&`), so other places may repeat it through an alias",
                "write the entry out in full without the anchor, then run install again",
            ))
        } else {
            let not_plain = || {
                Found::Left(Leave::then(
                    "it uses YAML aliases, merge keys (`<<`) or tags; Countersign reads plain \
                     values only",
                    "write its values out in the entry, then run install again",
                ))
            };
            match plain(&node) {
                Plain::Opaque => not_plain(),
                entry @ Plain::Map(_) if !entry.is_plain() => not_plain(),
                entry @ Plain::Map(_) => match entry.twice() {
                    Some(key) => Found::Left(Leave::then(
                        format!(
                            "it holds the key `{key}` twice, so which one {} reads is not clear",
                            client.title()
                        ),
                        "keep one of the two, then run install again",
                    )),
                    None => read_entry(client, &entry),
                },
                _ => Found::Left(Leave::then("it is not a mapping", FIX_BY_HAND)),
            }
        };
        out.push((at, found));
    }
    Ok(out)
}

fn strings(value: Option<&Plain>) -> Option<Vec<String>> {
    match value {
        None | Some(Plain::Null) => Some(Vec::new()),
        Some(Plain::List(items)) => items.iter().map(|i| i.text().map(str::to_owned)).collect(),
        Some(_) => None,
    }
}

fn pairs(value: Option<&Plain>) -> Option<Vec<(String, String)>> {
    match value {
        None | Some(Plain::Null) => Some(Vec::new()),
        Some(Plain::Map(map)) => map
            .iter()
            .map(|(k, v)| Some((k.clone(), v.text()?.to_owned())))
            .collect(),
        Some(_) => None,
    }
}

fn read_entry(client: Client, entry: &Plain) -> Found {
    let shape = client.spec().shape;
    let transport = entry.get("type").and_then(Plain::text);
    if let Some(program) = entry.get(shape.command).and_then(Plain::text) {
        let (Some(args), Some(env)) = (strings(entry.get("args")), pairs(entry.get(shape.env)))
        else {
            return Found::Left(Leave::then(
                format!(
                    "its `args` or `{}` is not what {} reads",
                    shape.env,
                    client.title()
                ),
                FIX_BY_HAND,
            ));
        };
        if is_wrapped(program, &args) {
            return Found::Wrapped;
        }
        // Goose keeps the values of `env_keys` in its own secret store.
        if !matches!(entry.get("env_keys"), None | Some(Plain::Null))
            && entry.get("env_keys") != Some(&Plain::List(Vec::new()))
        {
            return Found::Left(
                format!(
                    "its `env_keys` take values from {}'s own secret store, which the desk does \
                     not have; register it with `countersign server add` instead",
                    client.title()
                )
                .into(),
            );
        }
        let cwd = match entry.get("cwd") {
            None | Some(Plain::Null) => None,
            Some(Plain::Text(cwd)) => Some(cwd.clone()),
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
    let url_key = shape.url_keys.iter().find(|k| entry.get(k).is_some());
    if let Some(&url_key) = url_key {
        let Some(url) = entry.get(url_key).and_then(Plain::text) else {
            return Found::Left(Leave::then(
                format!("its `{url_key}` is not text"),
                FIX_BY_HAND,
            ));
        };
        if transport == Some("sse") {
            return Found::Left(Leave::then(
                "it is an SSE server, and the desk reaches streamable HTTP servers only",
                SSE_NEXT,
            ));
        }
        // Continue keeps headers under `requestOptions`, beside settings the desk would not
        // apply (timeouts, TLS).
        let headers = match entry.get("requestOptions") {
            None => entry.get("headers"),
            Some(Plain::Map(options)) if options.iter().all(|(k, _)| k == "headers") => {
                entry.get("requestOptions").and_then(|o| o.get("headers"))
            }
            Some(_) => {
                return Found::Left(Leave::then(
                    "its `requestOptions` hold more than headers, which the desk would not apply",
                    "register it with `countersign server add`, keeping only its headers",
                ));
            }
        };
        let Some(headers) = pairs(headers) else {
            return Found::Left(Leave::then(
                "its `headers` is not a mapping of text",
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
    Found::Left(Leave::then(
        shape.without_command,
        "nothing to do: it does not reach a server through a command or a URL",
    ))
}

/// The file with each entry in `names` rewritten to `program mcp --server NAME`, one entry at
/// a time, each edit proven to touch nothing outside that entry's value.
pub(super) fn rewrite(
    client: Client,
    text: &str,
    names: &[(EntryAt, String)],
    program: &str,
) -> Result<String, EditError> {
    let mut text = text.to_owned();
    for (at, name) in names {
        let file = parse(&text)?;
        let node = each_entry(client, &file)
            .into_iter()
            .find(|(found, _, _)| found == at)
            .map(|(_, node, _)| node)
            .ok_or_else(|| EditError::Gone { at: at.clone() })?;
        let Some(entry) = node.as_mapping() else {
            return Err(EditError::NotAMapping { at: at.clone() });
        };
        let range = node.byte_range();
        rewrite_entry(client, entry, program, &gateway_args(name));
        let edited = file.to_string();
        let (start, end) = (range.start as usize, range.end as usize);
        let kept = edited.len() >= start + (text.len() - end)
            && edited.starts_with(&text[..start])
            && edited.ends_with(&text[end..]);
        if !kept {
            return Err(EditError::Outside { at: at.clone() });
        }
        text = edited;
    }
    Ok(text)
}

fn rewrite_entry(client: Client, entry: &Mapping, program: &str, args: &[String]) {
    let shape = client.spec().shape;
    let args: Vec<YamlValue> = args.iter().map(|a| YamlValue::from(a.as_str())).collect();
    entry.set(shape.command, program);
    entry.set("args", args);
    for key in REACH_KEYS.iter().chain([&shape.env]).chain(shape.url_keys) {
        if entry.contains_key(*key) {
            entry.remove(*key);
        }
    }
    let kind = entry
        .get("type")
        .and_then(|t| t.as_scalar().map(|s| s.as_string()));
    match kind {
        Some(kind) if shape.stdio.contains(&kind.as_str()) => {}
        Some(_) => entry.set("type", shape.stdio[0]),
        None if shape.needs_type => entry.set("type", shape.stdio[0]),
        None => {}
    }
}

/// Where each entry's value is in `text`, for uninstall: one piece per entry.
pub(super) fn pieces(client: Client, text: &str) -> Result<Vec<(EntryAt, Vec<Piece>)>, ParseError> {
    let file = parse(text)?;
    Ok(each_entry(client, &file)
        .into_iter()
        .map(|(at, node, _)| {
            let range = node.byte_range();
            let piece = Piece {
                id: String::new(),
                range: range.start as usize..range.end as usize,
            };
            (at, vec![piece])
        })
        .collect())
}

/// A node as data, for uninstall to compare: an alias or a tagged node as its text.
fn value_of(text: &str, node: &YamlNode) -> serde_json::Value {
    match node {
        YamlNode::Scalar(s) if s.is_null() => serde_json::Value::Null,
        YamlNode::Scalar(s) => serde_json::Value::String(s.as_string()),
        YamlNode::Mapping(m) => m
            .iter()
            .map(|(k, v)| {
                let key = match &k {
                    YamlNode::Scalar(s) => s.as_string(),
                    other => format!("$yaml {}", source(text, other)),
                };
                (key, value_of(text, &v))
            })
            .collect(),
        YamlNode::Sequence(s) => s.values().map(|v| value_of(text, &v)).collect(),
        YamlNode::Alias(_) | YamlNode::TaggedNode(_) => {
            serde_json::json!({ "$yaml": source(text, node) })
        }
    }
}

fn source<'a>(text: &'a str, node: &YamlNode) -> &'a str {
    let range = node.byte_range();
    text.get(range.start as usize..range.end as usize)
        .unwrap_or_default()
}

/// The file as data, for uninstall to compare.
pub(super) fn plain_value(text: &str) -> Result<serde_json::Value, ParseError> {
    let file = parse(text)?;
    let Some(doc) = file.documents().next() else {
        return Ok(serde_json::Value::Null);
    };
    Ok(match doc.as_mapping() {
        Some(map) => value_of(text, &YamlNode::Mapping(map)),
        None => serde_json::json!({ "$yaml": text }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOSE: &str = "\
# Goose's settings
GOOSE_PROVIDER: anthropic   # which model host

defaults: &defaults
  timeout: 300

extensions:
  # the GitHub one
  github:
    name: github
    cmd: npx   # from npm
    args:
      - -y
      - \"@modelcontextprotocol/server-github\"
    envs:
      GITHUB_PERSONAL_ACCESS_TOKEN: ghp_yamlUnit0001
    enabled: true
    type: stdio

  shared: &shared
    cmd: uvx
    args: [shared-mcp]
  merged:
    <<: *defaults
    cmd: other-mcp


# two blank lines above, a comment below
other: *shared
";

    fn names(key: &str, name: &str) -> Vec<(EntryAt, String)> {
        vec![(
            EntryAt {
                parents: vec!["extensions".into()],
                key: key.into(),
            },
            name.into(),
        )]
    }

    #[test]
    fn comments_anchors_and_blank_lines_outside_the_entry_stay_byte_for_byte() {
        let out = rewrite(
            Client::Goose,
            GOOSE,
            &names("github", "github"),
            "countersign",
        )
        .unwrap();
        let (head, _) = GOOSE.split_once("    name: github\n").unwrap();
        let (_, tail) = GOOSE.split_once("    type: stdio\n").unwrap();
        assert!(out.starts_with(head), "{out}");
        assert!(out.ends_with(tail), "{out}");
        assert!(out.contains("cmd: countersign   # from npm"), "{out}");
        assert!(!out.contains("ghp_yamlUnit0001"), "{out}");
        assert!(out.contains("defaults: &defaults"));
        assert!(out.contains("other: *shared"));
        assert!(out.contains("\n\n\n# two blank lines above"));
    }

    #[test]
    fn an_anchored_or_merged_entry_is_left_as_it_is() {
        let found = entries(Client::Goose, GOOSE).unwrap();
        let why = |key: &str| match &found.iter().find(|(at, _)| at.key == key).unwrap().1 {
            Found::Left(left) => left.why.clone(),
            _ => panic!("{key} was not left"),
        };
        assert!(why("shared").contains("anchor"));
        assert!(why("merged").contains("merge keys"));
        assert!(matches!(
            found.iter().find(|(at, _)| at.key == "github").unwrap().1,
            Found::Server(_)
        ));
    }

    #[test]
    fn a_file_that_is_not_yaml_is_refused_without_quoting_it() {
        let Err(err) = entries(
            Client::Goose,
            "extensions:\n  a: {cmd: [x, \"sk_yamlUnit0002\n",
        ) else {
            panic!("an unterminated flow mapping was read")
        };
        let err = err.to_string();
        assert!(!err.contains("sk_yamlUnit0002"), "{err}");
    }

    #[test]
    fn two_documents_are_refused() {
        let Err(err) = entries(Client::Goose, "a: 1\n---\nb: 2\n") else {
            panic!("two documents were read")
        };
        let err = err.to_string();
        assert!(err.contains("2 YAML documents"), "{err}");
    }

    /// What install makes of each entry of `text` (Goose): `server`, `wrapped`, or why it is
    /// left.
    fn outcomes(text: &str) -> Vec<(String, String)> {
        entries(Client::Goose, text)
            .unwrap()
            .into_iter()
            .map(|(at, found)| {
                let what = match found {
                    Found::Server(_) => "server".to_owned(),
                    Found::Wrapped => "wrapped".to_owned(),
                    Found::Left(left) => left.why,
                };
                (at.key, what)
            })
            .collect()
    }

    /// Rewrites `key` and checks that the bytes before and after its value are the input's.
    fn rewritten(text: &str, key: &str, value_start: &str, value_end: &str) -> String {
        let out = rewrite(Client::Goose, text, &names(key, key), "countersign").unwrap();
        let (head, rest) = text.split_once(value_start).unwrap();
        let tail = &rest[rest.find(value_end).unwrap() + value_end.len()..];
        assert!(out.starts_with(head), "{out:?}");
        assert!(out.ends_with(tail), "{out:?}");
        assert!(!out.contains("sk_hostile"), "{out:?}");
        out
    }

    const ENTRY: &str = "extensions:\n  github:\n    cmd: npx   # from npm\n    args: [-y, x]\n    envs:\n      T: sk_hostile1\n    type: stdio\n# after\n";

    #[test]
    fn crlf_line_ends_are_kept_and_the_rewritten_lines_use_them_too() {
        let text = ENTRY.replace('\n', "\r\n");
        let out = rewritten(&text, "github", "  github:\r\n", "type: stdio\r\n");
        assert!(!out.replace("\r\n", "").contains('\n'), "{out:?}");
    }

    #[test]
    fn a_byte_order_mark_is_kept() {
        let text = format!("\u{feff}{ENTRY}");
        let out = rewritten(&text, "github", "  github:\n", "type: stdio\n");
        assert!(out.starts_with('\u{feff}'));
    }

    #[test]
    fn a_file_indented_with_tabs_is_refused() {
        let Err(err) = entries(Client::Goose, "extensions:\n\tgithub:\n\t\tcmd: npx\n") else {
            panic!("a tab-indented file was read")
        };
        let err = err.to_string();
        assert!(err.contains("line 2") && err.contains("tab"), "{err}");
        // A tab after a key is not indentation.
        let out = rewritten(
            "extensions:\n  github:\n    cmd:\tnpx\n    envs:\n      T: sk_hostile2\n",
            "github",
            "  github:\n",
            "sk_hostile2\n",
        );
        assert!(out.contains("cmd:\tcountersign"), "{out:?}");
    }

    #[test]
    fn flow_mappings_and_sequences_stay_flow() {
        let text = "extensions:\n  github: {cmd: npx, args: [-y, x], envs: {T: sk_hostile3}}\n  other: {cmd: uvx}\n";
        let out = rewritten(text, "github", "{cmd: npx", "sk_hostile3}}");
        assert!(
            out.contains(
                "github: {cmd: countersign, args: [mcp, '--server', github], type: stdio}"
            ),
            "{out:?}"
        );
        let whole = "extensions: {github: {cmd: npx, envs: {T: sk_hostile4}}}\n";
        let out = rewritten(whole, "github", "{cmd: npx", "sk_hostile4}}");
        assert!(out.ends_with("}}\n"), "{out:?}");
    }

    #[test]
    fn block_scalars_and_comments_inside_the_entry_are_read_and_kept_where_they_can_be() {
        let text = "extensions:\n  github:\n    # the command\n    description: |\n      line one\n      line two\n    cmd: npx # trailing\n    envs:\n      T: >-\n        sk_hostile5\n        folded\n    # end\n  next:\n    cmd: uvx\n";
        assert_eq!(
            outcomes(text),
            [
                ("github".into(), "server".into()),
                ("next".into(), "server".into())
            ]
        );
        let out = rewrite(
            Client::Goose,
            text,
            &names("github", "github"),
            "countersign",
        )
        .unwrap();
        assert!(
            out.contains("    # the command\n    description: |\n      line one\n      line two\n")
        );
        assert!(out.contains("cmd: countersign # trailing"), "{out:?}");
        assert!(
            out.ends_with("    # end\n  next:\n    cmd: uvx\n"),
            "{out:?}"
        );
        assert!(!out.contains("sk_hostile5"), "{out:?}");
    }

    #[test]
    fn a_key_twice_in_an_entry_is_left_with_the_key_named() {
        let found = outcomes(
            "extensions:\n  github:\n    cmd: a\n    cmd: b\n    envs: {T: sk_hostile6}\n",
        );
        assert!(found[0].1.contains("the key `cmd` twice"), "{found:?}");
        let found = outcomes("extensions:\n  github:\n    cmd: a\n    envs: {T: x, T: y}\n");
        assert!(found[0].1.contains("the key `T` twice"), "{found:?}");
    }

    #[test]
    fn an_alias_a_tag_or_an_anchored_mapping_of_entries_is_left_as_it_is() {
        let found = outcomes("x: &a {cmd: npx}\nextensions:\n  github: *a\n");
        assert!(found[0].1.contains("aliases"), "{found:?}");
        let found = outcomes("extensions:\n  github: !!map\n    cmd: npx\n");
        assert!(found[0].1.contains("tags"), "{found:?}");
        let text = "extensions: &e\n  github:\n    cmd: npx\ncopy: *e\n";
        let found = outcomes(text);
        assert!(
            found[0].1.contains("mapping of all the entries"),
            "{found:?}"
        );
    }

    #[test]
    fn very_deep_nesting_is_refused_without_quoting_it() {
        let text = format!(
            "extensions:\n  github:\n    cmd: npx\n    x: {}sk_hostile7{}\n",
            "[".repeat(5000),
            "]".repeat(5000)
        );
        let Err(err) = entries(Client::Goose, &text) else {
            panic!("5000 levels were read")
        };
        let err = err.to_string();
        assert!(!err.contains("sk_hostile7"), "{err}");
    }

    #[test]
    fn a_file_larger_than_any_configuration_is_refused() {
        let mut text = String::from("extensions:\n");
        while text.len() <= MAX_BYTES {
            text.push_str("  # padding padding padding padding padding padding padding padding\n");
        }
        let Err(err) = entries(Client::Goose, &text) else {
            panic!("a huge file was read")
        };
        let err = err.to_string();
        assert!(err.contains("KiB"), "{err}");
    }
}
