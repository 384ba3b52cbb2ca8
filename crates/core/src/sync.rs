//! One way to take a lock, for every crate: a `Mutex` whose holder panicked still hands out its
//! value.
//!
//! Why: the desk and `serve` serve many agents from one process, and a panic in one agent's
//! handler must not turn every later caller of a shared lock into a panic too (`lock().unwrap()`
//! does exactly that once the lock is poisoned). The state behind these locks (maps, counters,
//! queues) is kept whole by each critical section, so the value is still good to use. Clippy
//! refuses `Mutex::lock` everywhere else (`clippy.toml`), so this stays the one place that decides.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Takes `mutex`, recovering it if a holder panicked (see the module's doc for why that is safe
/// here).
#[allow(clippy::disallowed_methods)] // the one place that calls `Mutex::lock`
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_lock_whose_holder_panicked_still_hands_out_its_value() {
        let shared = Arc::new(Mutex::new(vec![1, 2]));
        let held = shared.clone();
        let panicked = std::thread::spawn(move || {
            let mut v = lock(&held);
            v.push(3);
            panic!("a handler failed while holding the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(shared.is_poisoned());
        assert_eq!(*lock(&shared), vec![1, 2, 3]);
    }
}
