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
use crate::json::SSE_NEXT;

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

fn parse(text: &str) -> Result<YamlFile, String> {
    let parsed = YamlFile::parse(text);
    if let Some(e) = parsed.positioned_errors().first() {
        // The line only: the parser's message may quote the text, which may be a secret.
        let start = (e.range.start as usize).min(text.len());
        let line = text.as_bytes()[..start]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            + 1;
        return Err(format!(
            "it is not YAML that Countersign can read (line {line})"
        ));
    }
    let file = parsed.tree();
    if file.to_string() != text {
        return Err(
            "Countersign's YAML reader would not keep this file byte for byte, so it is not \
             edited"
                .into(),
        );
    }
    match file.documents().count() {
        0 | 1 => Ok(file),
        n => Err(format!(
            "it holds {n} YAML documents, and a client reads a file of one"
        )),
    }
}

/// The node holding the entries (`extensions:` or `mcpServers:`), if the file has one.
fn container(client: Client, file: &YamlFile) -> Option<YamlNode> {
    let doc = file.documents().next()?;
    let mut node = YamlNode::Mapping(doc.as_mapping()?);
    for key in client.spec().servers_at[0] {
        node = node.as_mapping()?.get(*key)?;
    }
    Some(node)
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
    let Some(node) = container(client, file) else {
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
pub(super) fn entries(client: Client, text: &str) -> Result<Vec<(EntryAt, Found)>, String> {
    let file = parse(text)?;
    let mut seen = BTreeMap::new();
    let mut out = Vec::new();
    for (at, node, before) in each_entry(client, &file) {
        let count = seen.entry(at.key.clone()).or_insert(0);
        *count += 1;
        let found = if *count > 1 {
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
            match plain(&node) {
                Plain::Map(_) if !plain(&node).is_plain() => Found::Left(Leave::then(
                    "it uses YAML aliases, merge keys (`<<`) or tags; Countersign reads plain \
                     values only",
                    "write its values out in the entry, then run install again",
                )),
                entry @ Plain::Map(_) => read_entry(client, &entry),
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
) -> Result<String, String> {
    let mut text = text.to_owned();
    for (at, name) in names {
        let file = parse(&text)?;
        let node = each_entry(client, &file)
            .into_iter()
            .find(|(found, _, _)| found == at)
            .map(|(_, node, _)| node)
            .ok_or_else(|| format!("the entry {at} is gone from the file"))?;
        let Some(entry) = node.as_mapping() else {
            return Err(format!("the entry {at} is not a mapping"));
        };
        let range = node.byte_range();
        rewrite_entry(client, entry, program, &gateway_args(name));
        let edited = file.to_string();
        let (start, end) = (range.start as usize, range.end as usize);
        let kept = edited.len() >= start + (text.len() - end)
            && edited.starts_with(&text[..start])
            && edited.ends_with(&text[end..]);
        if !kept {
            return Err(format!(
                "rewriting {at} would change the file outside that entry, so it was not edited"
            ));
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
        assert!(!err.contains("sk_yamlUnit0002"), "{err}");
    }

    #[test]
    fn two_documents_are_refused() {
        let Err(err) = entries(Client::Goose, "a: 1\n---\nb: 2\n") else {
            panic!("two documents were read")
        };
        assert!(err.contains("2 YAML documents"), "{err}");
    }
}
