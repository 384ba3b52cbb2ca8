//! A connection from the command line to the registry (`countersign server ...`,
//! `countersign install`): one request, answered with `R` frames, the first of them
//! [`RegistryAnswer::Waiting`] when the person must decide.
//!
//! Only the desk's own account may ask: a registered command runs as the person, so an agent
//! account listed in the settings (which may reach registered servers) must not register them.
//! The command line proposes and the registry decides: a change of an existing server waits in
//! the window like a tool call; nothing here approves anything.

use countersign_registry::Registry;
use countersign_wire::{
    Frame, PROTOCOL_VERSION, RegistryAnswer, RegistryCode, RegistryRequest, write_frame,
};
use tokio::net::UnixStream;

use crate::peer::Peer;

/// Answers one registry request on `stream`.
pub(crate) async fn serve(
    registry: Option<Registry>,
    peer: Peer,
    version: u32,
    request: RegistryRequest,
    origin: String,
    mut stream: UnixStream,
) {
    let refuse = |code: RegistryCode, message: String| {
        Frame::Registry(RegistryAnswer::Refused { code, message })
    };
    let answer = if version != PROTOCOL_VERSION {
        refuse(
            RegistryCode::BadRequest,
            format!(
                "this desk speaks protocol version {PROTOCOL_VERSION}, the command {version}: \
                 update Countersign so that both come from the same release, and restart the desk"
            ),
        )
    } else if peer != Peer::Own {
        tracing::warn!(target: "desk", ?peer, "refused a registry request from an agent account");
        refuse(
            RegistryCode::AccountNotAllowed,
            "only the desk's own account may change its registry: a registered server runs as \
             that account"
                .into(),
        )
    } else if let Some(registry) = registry {
        let (waiting_tx, mut waiting_rx) = tokio::sync::mpsc::channel::<RegistryAnswer>(1);
        let handled = registry.handle(request, &origin, move |waiting| {
            let _ = waiting_tx.try_send(waiting);
        });
        tokio::pin!(handled);
        // The Waiting answer goes out as soon as it is known; the outcome follows.
        let answer = loop {
            tokio::select! {
                answer = &mut handled => break answer,
                Some(waiting) = waiting_rx.recv() => {
                    if write_frame(&mut stream, &Frame::Registry(waiting)).await.is_err() {
                        // The command went away: the change stays in the window for the person.
                        tracing::info!(target: "desk", "a registry request's command left before the person decided");
                    }
                }
            }
        };
        Frame::Registry(answer)
    } else {
        refuse(
            RegistryCode::Failed,
            "this desk has no registry (it could not open its files at start: see its log)".into(),
        )
    };
    let _ = write_frame(&mut stream, &answer).await;
}
