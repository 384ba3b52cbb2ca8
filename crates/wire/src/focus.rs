//! The focus hello: what a second start of the desk, and `countersign open`, send to the desk
//! already running so that it brings its window forward (showing one request, when a
//! `countersign://request/<id>` URL named it). Both send it through [`focus_desk`], so the hello
//! and how long it waits have one home.
//!
//! Nothing in it approves or denies: the running desk only shows its window. It closes the
//! connection once it has asked the window forward; a desk that does not answer within
//! [`FOCUS_WAIT`] is left to itself rather than holding up the process that asked.

use std::io;
use std::path::Path;
use std::time::Duration;

use tokio::net::UnixStream;

use crate::{Frame, Hello, read_frame, write_frame};

/// How long the focus hello waits to connect, and then for the desk to close the connection.
pub const FOCUS_WAIT: Duration = Duration::from_secs(5);

/// Asks the desk listening at `socket` to bring its window forward, showing `request` when one
/// is given. An error of kind `NotFound` or `ConnectionRefused` means no desk listens there;
/// `TimedOut`, that one did not accept the connection within [`FOCUS_WAIT`].
pub async fn focus_desk(socket: &Path, request: Option<u64>) -> io::Result<()> {
    let mut stream = tokio::time::timeout(FOCUS_WAIT, UnixStream::connect(socket)).await??;
    write_frame(&mut stream, &Frame::Hello(Hello::focus(request)))
        .await
        .map_err(io::Error::other)?;
    // The desk closes the connection once it has asked its window forward.
    let _ = tokio::time::timeout(FOCUS_WAIT, read_frame(&mut stream)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FrameError;

    #[tokio::test]
    async fn the_running_desk_receives_one_focus_hello_naming_the_request() {
        let dir = std::env::temp_dir().join(format!("cs-focus-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("desk.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let desk = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let hello = read_frame(&mut stream).await.unwrap();
            // Nothing follows the hello; the desk then closes.
            let after = read_frame(&mut stream).await;
            (hello, matches!(after, Err(FrameError::Closed)))
        });
        focus_desk(&socket, Some(7)).await.unwrap();
        let (hello, then_closed) = desk.await.unwrap();
        assert_eq!(hello, Frame::Hello(Hello::focus(Some(7))));
        assert!(then_closed);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn no_desk_is_not_found_or_refused() {
        let missing = std::env::temp_dir().join(format!("cs-focus-none-{}", std::process::id()));
        let err = focus_desk(&missing.join("desk.sock"), None)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ),
            "{err:?}"
        );
    }
}
