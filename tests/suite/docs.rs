//! The documentation leads somewhere: every relative link in the README and in `docs/` reaches a
//! file that exists, and a heading that exists where the link names one; the README links every
//! page of `docs/`; and every document a code comment cites exists, with the section it names.
//!
//! Why: the README is a front door to `docs/`, the pages link each other by heading, and code
//! comments send a reader to a named section of a page. A page moved or a heading renamed would
//! leave them pointing at nothing, and nothing else would notice. Plain std: the Markdown read
//! here is only fences, headings, code spans and `](target)`, and anchors are the slugs GitHub
//! gives headings.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The repository's root (this crate is `tests/`).
fn root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().expect("tests/ has a parent").to_path_buf()
}

/// The README and every page of `docs/`, in a stable order.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// `path` relative to the root, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// `path` with `.` and `..` resolved by text (the file need not exist).
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The anchor GitHub gives a heading: its text as rendered (code spans without their backticks,
/// emphasis without its markers, a link as its text), lower-cased, every character that is not
/// a letter, a digit, `-`, `_` or a space dropped, and spaces made `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // A link in a heading renders as its text.
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find("](").and_then(|close| {
            after[close + 2..]
                .find(')')
                .map(|end| (close, close + 2 + end + 1))
        }) {
            Some((close, end)) => {
                text.push_str(&after[..close]);
                rest = &after[end..];
            }
            None => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.chars()
        .filter(|c| *c != '`' && *c != '*')
        .filter_map(|c| {
            if c == ' ' {
                Some('-')
            } else if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c)
            } else {
                None
            }
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// The lines of a Markdown text that are outside fenced code blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The anchors of a Markdown text's headings, as GitHub makes them (a repeated one gains `-1`,
/// `-2`, ...).
fn anchors(text: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let heading = line[hashes..].trim().trim_end_matches('#').trim();
        let base = slug(heading);
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 { base } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// `text` with its code spans blanked out (a run of backticks up to the next run of as many),
/// so that nothing inside one reads as a link. Line breaks are kept, so line numbers still hold.
fn without_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|c| **c == '`').count();
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let n = chars[j..].iter().take_while(|c| **c == '`').count();
                if n == run {
                    close = Some(j);
                    break;
                }
                j += n;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                out.extend(chars[i..j + run].iter().filter(|c| **c == '\n'));
                i = j + run;
            }
            None => {
                out.extend(&chars[i..i + run]);
                i += run;
            }
        }
    }
    out
}

/// The link targets of a Markdown text outside fences and code spans, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<(usize, &str)> = prose(text);
    let joined: String = lines.iter().map(|(_, l)| *l).collect::<Vec<_>>().join("\n");
    let stripped = without_code_spans(&joined);
    let mut out = Vec::new();
    for (k, line) in stripped.split('\n').enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push((lines[k].0, target.trim_matches(['<', '>']).to_owned()));
            rest = &after[end..];
        }
    }
    out
}

/// Whether a link target leaves the repository (a URL, a mail address).
fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

#[test]
fn every_relative_link_in_the_readme_and_docs_leads_to_a_file_and_heading_that_exist() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = fs::read_to_string(&page).unwrap();
        for (line, target) in links(&text) {
            if target.is_empty() || is_external(&target) {
                continue;
            }
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.clone()
            } else {
                normal(&page.parent().unwrap().join(path))
            };
            let at = format!("{}:{line}: ({target})", shown(&page));
            if !file.exists() {
                broken.push(format!("{at}: {} does not exist", shown(&file)));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            let Ok(target_text) = fs::read_to_string(&file) else {
                broken.push(format!("{at}: {} is not a text file", shown(&file)));
                continue;
            };
            if !anchors(&target_text).iter().any(|a| a == fragment) {
                broken.push(format!(
                    "{at}: {} has no heading whose anchor is #{fragment}",
                    shown(&file)
                ));
            }
        }
    }
    assert!(checked > 0, "no relative link was found to check");
    assert!(
        broken.is_empty(),
        "links that lead nowhere:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_readme_links_every_page_of_docs() {
    let root = root();
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    let linked: Vec<PathBuf> = links(&readme)
        .into_iter()
        .filter(|(_, t)| !is_external(t))
        .map(|(_, t)| normal(&root.join(t.split('#').next().unwrap())))
        .collect();
    let unlinked: Vec<String> = pages()
        .into_iter()
        .skip(1)
        .filter(|page| !linked.contains(page))
        .map(|page| shown(&page))
        .collect();
    assert!(unlinked.is_empty(), "README.md links none of: {unlinked:?}");
}

/// One comment's text, its lines joined, and where it starts.
struct Comment {
    file: PathBuf,
    line: usize,
    text: String,
}

/// The comment marker of a source file, by its name: `//` for Rust and JavaScript, `#` for TOML,
/// Python, shell and the Makefile (and the scripts of `.ci/`, which have no extension).
fn marker(path: &Path) -> Option<&'static str> {
    let name = path.file_name()?.to_str()?;
    let in_ci = path
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|d| d == ".ci");
    match path.extension().and_then(|e| e.to_str()) {
        Some("rs" | "js") => Some("//"),
        Some("toml" | "py" | "sh") => Some("#"),
        None if name == "Makefile" || in_ci => Some("#"),
        _ => None,
    }
}

/// Every source file of the repository with comments to read (build output, dependencies and
/// the repository's own database left out).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if !matches!(name.as_ref(), ".git" | "target" | "node_modules") {
                sources(&path, out);
            }
        } else if marker(&path).is_some() {
            out.push(path);
        }
    }
}

/// The comments of a source file: runs of lines that are comments alone, their markers taken off
/// and their lines joined with a space, so a citation wrapped over two lines reads as one.
fn comments(file: &Path) -> Vec<Comment> {
    let marker = marker(file).unwrap();
    let text = String::from_utf8_lossy(&fs::read(file).unwrap()).into_owned();
    let mut out: Vec<Comment> = Vec::new();
    let mut open = false;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let Some(body) = trimmed.strip_prefix(marker) else {
            open = false;
            continue;
        };
        let body = body.trim_start_matches(['/', '!']).trim();
        if open {
            let last = out.last_mut().unwrap();
            last.text.push(' ');
            last.text.push_str(body);
        } else {
            out.push(Comment {
                file: file.to_path_buf(),
                line: i + 1,
                text: body.to_owned(),
            });
            open = true;
        }
    }
    out
}

/// What a comment cites: a document's path as written, and the section it names, either in
/// quotes after a comma (`docs/design.md, "Servers and credentials"`) or as an anchor
/// (`docs/design.md#servers-and-credentials`), as that section's anchor.
fn citations(text: &str) -> Vec<(String, Option<String>)> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-');
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find(".md") {
        let dot = from + found;
        let end = dot + 3;
        from = end;
        if text[end..]
            .chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let start = text[..dot]
            .char_indices()
            .rev()
            .take_while(|(_, c)| path_char(*c))
            .last()
            .map_or(dot, |(i, _)| i);
        let path = &text[start..end];
        // No name (`*.md`), an absolute path or a URL's (`https://host/x.md`): not a citation
        // of a document of this repository.
        let stem = &path[..path.len() - 3];
        if stem.is_empty() || stem.ends_with('/') || path.starts_with('/') {
            continue;
        }
        let after = &text[end..];
        let section = if let Some(anchor) = after.strip_prefix('#') {
            Some(
                anchor
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || matches!(c, '-' | '_'))
                    .collect(),
            )
        } else {
            after
                .trim_start()
                .strip_prefix(',')
                .map(str::trim_start)
                .and_then(|s| s.strip_prefix('"'))
                .and_then(|s| s.split_once('"'))
                .map(|(named, _)| slug(&named.split_whitespace().collect::<Vec<_>>().join(" ")))
        };
        out.push((path.to_owned(), section));
    }
    out
}

/// Where a cited path is: from the repository's root, from the citing file's folder, or from
/// its crate's.
fn resolve(cited: &str, file: &Path) -> Option<PathBuf> {
    let root = root();
    let mut bases = vec![root.clone(), file.parent().unwrap().to_path_buf()];
    if let Some(krate) = file
        .ancestors()
        .skip(1)
        .take_while(|d| d.starts_with(&root))
        .find(|d| d.join("Cargo.toml").is_file())
    {
        bases.push(krate.to_path_buf());
    }
    bases
        .into_iter()
        .map(|base| normal(&base.join(cited)))
        .find(|p| p.is_file())
}

#[test]
fn every_document_a_code_comment_cites_exists_with_the_section_it_names() {
    let mut files = Vec::new();
    sources(&root(), &mut files);
    let mut broken = Vec::new();
    let mut cited = 0;
    for file in &files {
        for comment in comments(file) {
            for (path, section) in citations(&comment.text) {
                cited += 1;
                let at = format!("{}:{}: {path}", shown(&comment.file), comment.line);
                let Some(found) = resolve(&path, &comment.file) else {
                    broken.push(format!("{at}: no such document in the repository"));
                    continue;
                };
                let Some(section) = section else { continue };
                let text = fs::read_to_string(&found).unwrap();
                if !anchors(&text).contains(&section) {
                    broken.push(format!(
                        "{at}: {} has no heading whose anchor is #{section}",
                        shown(&found)
                    ));
                }
            }
        }
    }
    assert!(
        cited > 0,
        "no comment cites a document: the scan found nothing"
    );
    assert!(
        broken.is_empty(),
        "comments that cite what is not there:\n{}",
        broken.join("\n")
    );
}

#[test]
fn heading_anchors_are_the_slugs_github_gives_them() {
    assert_eq!(
        slug("For teams: `countersign serve`"),
        "for-teams-countersign-serve"
    );
    assert_eq!(
        slug("A client's own timeout, and the person's time"),
        "a-clients-own-timeout-and-the-persons-time"
    );
    assert_eq!(
        slug("The agent's stdio, handed to the desk (Linux)"),
        "the-agents-stdio-handed-to-the-desk-linux"
    );
    assert_eq!(slug("`--unauthenticated`"), "--unauthenticated");
    assert_eq!(
        slug("The gateway ⇄ desk protocol"),
        "the-gateway--desk-protocol"
    );
    assert_eq!(
        anchors("# A\n```sh\n# not a heading\n```\n## A\n### B_c\n"),
        ["a", "a-1", "b_c"]
    );
}

#[test]
fn a_citation_wrapped_over_comment_lines_names_its_section() {
    let file = root().join("crates/desk/src/commands/servers.rs");
    let joined: Vec<(String, Option<String>)> = comments(&file)
        .iter()
        .flat_map(|c| citations(&c.text))
        .collect();
    assert!(
        joined.contains(&(
            "docs/design.md".to_owned(),
            Some("servers-and-credentials".to_owned())
        )),
        "{joined:?}"
    );
    assert!(citations("see https://example.com/a.md and *.md, and x.mdx").is_empty());
    assert_eq!(
        citations("docs/wire.md#frames, or docs/tokens.md"),
        [
            ("docs/wire.md".to_owned(), Some("frames".to_owned())),
            ("docs/tokens.md".to_owned(), None)
        ]
    );
}
