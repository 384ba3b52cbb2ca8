//! What a test reads back from disk: every file under a directory, and the check that a secret
//! (a token, a credential) is in none of them.

use std::path::{Path, PathBuf};

/// Every entry under `dir` that is not a directory, sorted; symbolic links are listed, not
/// followed. An unreadable directory is skipped.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => found.extend(files_under(&path)),
            Ok(_) => found.push(path),
            Err(_) => {}
        }
    }
    found
}

/// Whether `haystack` holds `needle` anywhere.
pub fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Fails the test when any file under any of `dirs` holds `secret`, naming the file (never the
/// secret's surroundings). Returns the files read, for the caller to check the scan saw what it
/// should.
pub fn assert_in_no_file(dirs: &[&Path], secret: &str) -> Vec<PathBuf> {
    let mut read = Vec::new();
    for dir in dirs {
        for file in files_under(dir) {
            let bytes = std::fs::read(&file).unwrap_or_default();
            assert!(
                !contains(&bytes, secret),
                "a secret is in {}",
                file.display()
            );
            read.push(file);
        }
    }
    read
}
