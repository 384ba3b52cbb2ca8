//! A round-robin TCP proxy on loopback: one address in front of several replicas of a server,
//! each new connection to the next one, as a load balancer in front of `countersign serve`
//! would do.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};

/// The proxy; it stops when dropped.
#[derive(Debug)]
pub struct RoundRobin {
    port: u16,
    task: tokio::task::JoinHandle<()>,
    /// The backend every new connection goes to, by index, or `usize::MAX` for each in turn.
    pinned: Arc<AtomicUsize>,
}

impl RoundRobin {
    /// A proxy in front of `127.0.0.1:PORT` for each of `backends`, in turn.
    pub async fn start(backends: Vec<u16>) -> RoundRobin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let next = Arc::new(AtomicUsize::new(0));
        let pinned = Arc::new(AtomicUsize::new(usize::MAX));
        let pin = pinned.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let index = match pin.load(Ordering::SeqCst) {
                    usize::MAX => next.fetch_add(1, Ordering::Relaxed),
                    index => index,
                };
                let backend = backends[index % backends.len()];
                tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(("127.0.0.1", backend)).await {
                        // Each chunk goes on as it comes, as a balancer's does: Nagle's wait for
                        // an acknowledgement would only add time no server causes.
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        RoundRobin { port, task, pinned }
    }

    /// From now on, every new connection goes to backend `index` (as a balancer that moved an
    /// agent from one replica to another would); `None`: each to the next, in turn.
    pub fn pin(&self, index: Option<usize>) {
        self.pinned
            .store(index.unwrap_or(usize::MAX), Ordering::SeqCst);
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.task.abort();
    }
}
