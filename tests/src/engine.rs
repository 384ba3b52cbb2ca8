//! The engine as every test builds it: on a real SQLite file, with one test key, the approve
//! delay at 0 (approvals below the window come right after the preflight), and waiting for the
//! queue by its events, never by polling. The engine's own suite, the pipe's and the cross-crate
//! tests all build it here, so a change to how an engine is made is made once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use countersign_core::token::SigningKey;
use countersign_engine::{Engine, EngineConfig, ManualClock, NoKey};
use countersign_store::{Sqlite, StoreOptions};
use tokio::sync::broadcast::error::RecvError;

/// The key every engine test signs with.
pub fn key() -> SigningKey {
    SigningKey::new(&[7; 32]).unwrap()
}

/// The configuration every engine test starts from: no person's delay to wait out (approvals
/// below the window come right after the preflight).
pub fn config() -> EngineConfig {
    let mut config = EngineConfig::new();
    config.approve_delay_ms = 0;
    config
}

/// The records every engine test keeps: `desk.sqlite` under `dir`.
pub fn records(dir: &Path) -> Arc<Sqlite> {
    Arc::new(Sqlite::open_deferred(
        dir.join("desk.sqlite"),
        StoreOptions::default(),
    ))
}

/// An engine of `config` on the records in `dir` ([`records`]), signing with [`key`].
pub fn engine(dir: &Path, config: EngineConfig) -> Engine {
    Engine::new(config, records(dir), Ok(key()))
}

/// Makes `config`'s time a manual clock, returned for the test to move instead of sleeping.
pub fn manual_clock(config: &mut EngineConfig) -> ManualClock {
    let clock = ManualClock::starting_now();
    config.clock = Arc::new(clock.clone());
    clock
}

/// An engine on a real SQLite file in a directory of its own, signing with [`key`], its time a
/// [`ManualClock`] the test moves.
pub struct Desk {
    /// The engine.
    pub engine: Engine,
    /// The engine's time: tests move it instead of sleeping.
    pub clock: ManualClock,
    /// The engine's file.
    pub path: PathBuf,
    /// The directory that holds the file (removed when the desk is dropped).
    pub dir: tempfile::TempDir,
}

impl Desk {
    /// The engine of [`config`], changed by `configure`.
    pub fn new(configure: impl FnOnce(&mut EngineConfig)) -> Desk {
        Desk::with_key(Ok(key()), configure)
    }

    /// The same with `key` as the engine's (or its lack).
    pub fn with_key(
        key: Result<SigningKey, NoKey>,
        configure: impl FnOnce(&mut EngineConfig),
    ) -> Desk {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config();
        let clock = manual_clock(&mut config);
        configure(&mut config);
        Desk {
            clock,
            path: dir.path().join("desk.sqlite"),
            engine: Engine::new(config, records(dir.path()), key),
            dir,
        }
    }

    /// Another engine on this desk's file, as the desk started again: `configure` changes
    /// [`config`].
    pub fn again(&self, configure: impl FnOnce(&mut EngineConfig)) -> Engine {
        let mut config = config();
        configure(&mut config);
        engine(self.dir.path(), config)
    }
}

/// Waits until `done` holds, checking it again after each change the engine publishes (never on
/// a timer). Panics after 10 s: what the test waits for never happened.
pub async fn until(engine: &Engine, done: impl Fn() -> bool) {
    let mut changes = engine.subscribe();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        match tokio::time::timeout_at(deadline, changes.recv()).await {
            Ok(Ok(_) | Err(RecvError::Lagged(_))) => {}
            Ok(Err(RecvError::Closed)) => panic!("the engine is gone"),
            Err(_) => panic!("what the test waits for never happened within 10 s"),
        }
    }
}
