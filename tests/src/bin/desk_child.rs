//! The desk's engine and sessions in a process of their own, for tests that must kill, restart
//! or load a desk: `desk_child SOCKET DB [--approve]`.
//!
//! It is the desk minus the window: the same engine, store file and socket server, with a fixed
//! test key (so a restarted child verifies the tokens the one before it minted, as a desk reading
//! the keychain would). With `--approve` it approves every request that reaches its queue by
//! calling `Engine::approve`, the function the window's Approve button calls: the click, below
//! the window, inside a test program. It prints `READY` once it listens and runs until killed or
//! until its stdin closes. It ignores SIGXFSZ, so that a test can stand a file-size limit in for
//! a full disk. Never built into the product.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::io::Write;
use std::path::PathBuf;

use countersign_core::token::SigningKey;
use countersign_engine::{Engine, EngineConfig, QueueChange};
use tokio::io::AsyncReadExt;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (socket, db) = match args.as_slice() {
        [socket, db, ..] => (PathBuf::from(socket), PathBuf::from(db)),
        _ => {
            eprintln!("usage: desk_child SOCKET DB [--approve]");
            std::process::exit(2);
        }
    };
    let approve = args.iter().any(|a| a == "--approve");
    // A file-size limit (which tests set to stand in for a full disk) then fails the write with
    // EFBIG, as a full disk fails it with ENOSPC, instead of killing the process with SIGXFSZ.
    // SAFETY: setting a signal's disposition to ignore, before any thread exists.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(async move {
        let key = SigningKey::new(&[42; 32]).expect("a 32-byte key");
        let mut config = EngineConfig::new();
        config.approve_delay_ms = 0;
        config.describer = Some(std::sync::Arc::new(
            countersign_session::SqlDescriber::default(),
        ));
        let records = std::sync::Arc::new(countersign_store::Sqlite::open_deferred(
            db,
            countersign_store::StoreOptions::default(),
        ));
        let engine = Engine::new(config, records, Ok(key));
        if approve {
            let clicker = engine.clone();
            let mut changes = engine.subscribe();
            tokio::spawn(async move {
                loop {
                    match changes.recv().await {
                        Ok(QueueChange::Added { request }) => {
                            let typed = request.type_target().then(|| request.plan.target.clone());
                            let _ = clicker.approve(request.id, typed.as_deref()).await;
                        }
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            for request in clicker.pending() {
                                let typed =
                                    request.type_target().then(|| request.plan.target.clone());
                                let _ = clicker.approve(request.id, typed.as_deref()).await;
                            }
                        }
                        Err(_) => break,
                    }
                }
            });
        }
        let served = countersign_session::serve(engine, socket)
            .await
            .expect("the desk serves its socket");
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "READY").expect("stdout");
            out.flush().expect("stdout");
        }
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
        drop(served);
    });
}
