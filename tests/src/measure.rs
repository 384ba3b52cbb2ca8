//! What the benches read about a process from `/proc`: memory (PSS, RSS), CPU time, threads,
//! open descriptors, children. Linux only, as the desk's benches are; a process that is gone (or
//! a field that cannot be read) reads as `None` or zero rather than failing the bench.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::time::Duration;

/// The fields of `/proc/PID/stat` after the command name (which may hold spaces and parentheses):
/// index 0 is the state (field 3 of proc(5)), so field N is at index N - 3.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after) = stat.rsplit_once(')')?;
    Some(after.split_whitespace().map(str::to_owned).collect())
}

/// A field of `/proc/PID/smaps_rollup`, in kB.
fn rollup_kb(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A process's proportional set size (its private pages, plus its share of those it shares), in
/// kB, from `/proc/PID/smaps_rollup`.
pub fn pss_kb(pid: u32) -> Option<u64> {
    rollup_kb(pid, "Pss:")
}

/// The anonymous part of [`pss_kb`] (heap and stacks, not the program's own pages), in kB.
pub fn pss_anon_kb(pid: u32) -> Option<u64> {
    rollup_kb(pid, "Pss_Anon:")
}

/// A process's unique set size: the pages only it maps (`Private_Clean` plus `Private_Dirty` of
/// `/proc/PID/smaps_rollup`), in kB. Unlike [`pss_kb`], it does not depend on what else on the
/// machine maps the same libraries.
pub fn uss_kb(pid: u32) -> Option<u64> {
    Some(rollup_kb(pid, "Private_Clean:")? + rollup_kb(pid, "Private_Dirty:")?)
}

/// A field of `/proc/PID/status` given in kB or as a count (`VmRSS:`, `Threads:`).
fn status_field(pid: u32, name: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// A process's resident set size (VmRSS), in kB.
pub fn rss_kb(pid: u32) -> Option<u64> {
    status_field(pid, "VmRSS:")
}

/// How many threads a process has.
pub fn threads(pid: u32) -> Option<u64> {
    status_field(pid, "Threads:")
}

/// How many file descriptors a process has open (entries of `/proc/PID/fd`).
pub fn open_fds(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// The CPU time a process has used so far, user plus system, all its threads (utime + stime of
/// `/proc/PID/stat`, in clock ticks: a resolution of 10 ms on most systems).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let fields = stat_fields(pid)?;
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_nanos(ticks * 1_000_000_000 / per_second))
}

/// A process's state letter (`R`, `S`, `Z` for a zombie nobody reaped, ...).
pub fn state(pid: u32) -> Option<char> {
    stat_fields(pid)?.first()?.chars().next()
}

/// The direct children of a process, started by any of its threads
/// (`/proc/PID/task/*/children`).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every descendant of a process: its children, theirs, and so on.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut found = children(pid);
    let mut next = 0;
    while next < found.len() {
        let grandchildren = children(found[next]);
        found.extend(grandchildren);
        next += 1;
    }
    found
}

/// The desk and its web processes: everything in the WebDriver session's process group but the
/// drivers themselves, as `(pid, command name)`.
pub fn desk_processes(group: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let pgrp: Option<u32> = stat_fields(pid).and_then(|f| f.get(2)?.parse().ok());
        if pgrp != Some(group) {
            continue;
        }
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap_or_default()
            .trim()
            .to_owned();
        if !name.contains("tauri-driver") && !name.contains("WebKitWebDriv") {
            out.push((pid, name));
        }
    }
    out
}

/// The PSS summed over [`desk_processes`], in MB.
pub fn desk_pss_mb(group: u32) -> f64 {
    let kb: u64 = desk_processes(group)
        .into_iter()
        .map(|(pid, _)| pss_kb(pid).unwrap_or(0))
        .sum();
    kb as f64 / 1024.0
}

/// Raises this process's soft descriptor limit to the hard one (a bench opens many sockets).
pub fn raise_descriptor_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
