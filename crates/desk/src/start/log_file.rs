//! The desk's log file: `desk.log` in its state directory, rotated by size.
//!
//! A desk a gateway started has no terminal: its stderr goes nowhere. Security events (refusals,
//! replays, connections refused by account, variables scrubbed at start) must still survive
//! somewhere when the SQLite store is what failed, so the desk writes its log to this file as
//! well as to stderr. When the file would grow past its limit it becomes `desk.log.1`, the older
//! ones shift up, and the oldest beyond the kept number is removed: the log never fills the disk.
//! The files are 0600 in the 0700 state directory.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The log's file name in the state directory.
pub const FILE_NAME: &str = "desk.log";

/// A file that starts over, keeping `keep` older files, when a write would take it past
/// `max_bytes`. Each `write` is one log event, so events are never split across files.
#[derive(Debug)]
pub struct RotatingFile {
    path: PathBuf,
    max_bytes: u64,
    keep: usize,
    file: File,
    size: u64,
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

impl RotatingFile {
    /// Opens (appending) `dir/name`.
    pub fn open(dir: &Path, name: &str, max_bytes: u64, keep: usize) -> io::Result<Self> {
        let path = dir.join(name);
        let file = open_append(&path)?;
        let size = file.metadata()?.len();
        Ok(Self {
            path,
            max_bytes,
            keep,
            file,
            size,
        })
    }

    /// The desk's log in `state`: 2 MiB a file, four older files kept (10 MiB at most).
    pub fn desk_log(state: &Path) -> io::Result<Self> {
        Self::open(state, FILE_NAME, 2 * 1024 * 1024, 4)
    }

    fn numbered(&self, n: usize) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        name.into()
    }

    fn rotate(&mut self) -> io::Result<()> {
        if self.keep == 0 {
            self.file = OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&self.path)?;
        } else {
            let _ = std::fs::remove_file(self.numbered(self.keep));
            for n in (1..self.keep).rev() {
                let _ = std::fs::rename(self.numbered(n), self.numbered(n + 1));
            }
            std::fs::rename(&self.path, self.numbered(1))?;
            self.file = open_append(&self.path)?;
        }
        self.size = 0;
        Ok(())
    }
}

impl Write for RotatingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.size > 0 && self.size + buf.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(buf)?;
        self.size += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_rotates_by_size_and_keeps_a_few_older_files() {
        let dir = std::env::temp_dir().join(format!("cs-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut log = RotatingFile::open(&dir, "desk.log", 100, 2).unwrap();
        for i in 0..10 {
            log.write_all(format!("event {i:02} {}\n", "x".repeat(30)).as_bytes())
                .unwrap();
        }
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        // 42 bytes an event, 100 a file: two events a file, the newest in desk.log.
        assert!(
            read("desk.log").contains("event 09"),
            "{}",
            read("desk.log")
        );
        assert!(read("desk.log.1").contains("event 07"));
        assert!(read("desk.log.2").contains("event 05"));
        assert!(
            !dir.join("desk.log.3").exists(),
            "only two older files kept"
        );
        for name in ["desk.log", "desk.log.1", "desk.log.2"] {
            assert!(read(name).len() <= 100, "{name}");
            let mode = std::os::unix::fs::PermissionsExt::mode(
                &std::fs::metadata(dir.join(name)).unwrap().permissions(),
            );
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
