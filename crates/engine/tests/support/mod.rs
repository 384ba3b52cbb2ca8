//! What every engine test file shares: waiting for the queue by its events, never by polling.

use std::time::Duration;

use countersign_engine::Engine;
use tokio::sync::broadcast::error::RecvError;

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
