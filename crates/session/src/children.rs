//! The upstream processes the desk started, so that none outlives its session or the desk.
//!
//! Each upstream runs in a process group of its own (a server started through `npx` or a shell
//! has children of its own). A [`Group`] kills its whole group when dropped; [`Children`] knows
//! every live group, so that the desk can end them all when it exits, even where destructors do
//! not run.
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use countersign_core::sync::lock;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// Every live upstream process group of this desk. Cheap to clone: clones share the set.
#[derive(Debug, Clone, Default)]
pub struct Children {
    groups: Arc<Mutex<HashSet<i32>>>,
}

impl Children {
    /// Records the group led by `pid`; dropping the returned [`Group`] kills it.
    pub fn add(&self, pid: i32) -> Group {
        lock(&self.groups).insert(pid);
        Group {
            pid,
            children: self.clone(),
        }
    }

    /// Kills every live group (the desk is exiting).
    pub fn kill_all(&self) {
        let groups: Vec<i32> = lock(&self.groups).drain().collect();
        for pid in groups {
            kill_group(pid);
        }
    }

    /// How many groups are live.
    pub fn len(&self) -> usize {
        lock(&self.groups).len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One upstream's process group, killed when dropped.
#[derive(Debug)]
pub struct Group {
    pid: i32,
    children: Children,
}

impl Drop for Group {
    fn drop(&mut self) {
        let live = lock(&self.children.groups).remove(&self.pid);
        if live {
            kill_group(self.pid);
        }
    }
}

fn kill_group(pid: i32) {
    if pid > 1 {
        // SAFETY: kill has no memory-safety preconditions; a negative pid names the group this
        // pid leads (it was spawned with process_group(0)), and a group already gone is ESRCH.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}
