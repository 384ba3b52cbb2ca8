//! The channel between the desk and its window's process: one end of a socket pair the desk makes
//! and hands down to the process it starts, as descriptor [`CHANNEL_FD`]. It is never bound to a
//! name, so nobody but the desk and that process holds it; the window's process checks that its
//! peer is its parent before it reads a byte.
//!
//! One JSON message per line, each way, at most [`MAX_LINE`] bytes. The window sends what the page
//! invoked and how the window stands; the desk sends answers, the events the page listens for, and
//! what to do with the window. The page's commands run in the desk ([`crate::commands::run`]);
//! the window's process runs none itself.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// The descriptor the window's process finds its end of the channel on.
pub const CHANNEL_FD: i32 = 3;

/// The argument that starts `countersign-desk` as the window's process (with the channel on
/// [`CHANNEL_FD`]). Anything else it is started with makes it the desk.
pub const WINDOW_FLAG: &str = "--window-of-desk";

/// The longest message either side takes (a line longer than this ends the channel).
pub const MAX_LINE: usize = 16 << 20;

/// What the window's process tells the desk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum FromWindow {
    /// The page invoked `command` with `args` (Tauri has checked the window's capability).
    Invoke {
        /// Echoed in the answer.
        id: u64,
        /// The command's name.
        command: String,
        /// Its arguments, as the page sent them.
        #[serde(default)]
        args: Value,
    },
    /// How the window stands, sent at every change.
    Seen {
        /// On screen (or minimized), not closed.
        visible: bool,
        /// Has the keyboard focus.
        focused: bool,
    },
    /// The page has loaded. (A struct variant, so that a field it does not have is refused.)
    Loaded {},
}

/// What the desk tells its window's process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToWindow {
    /// The answer to [`FromWindow::Invoke`] `id`: refused when `err` (a `UiError`) is there,
    /// else `ok`.
    Answer {
        /// The invoke's id.
        id: u64,
        /// The command's view (`null` for a command that answers nothing).
        #[serde(default)]
        ok: Value,
        /// Why it was refused.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        err: Option<Value>,
    },
    /// An event for the page.
    Emit {
        /// Its name (`queue://changed`, `approvals://held`, …).
        event: String,
        /// Its payload.
        payload: Value,
    },
    /// Make the window (hidden) and load its page, when it is not made yet. A window's process
    /// makes no window until told: the desk starts one ahead of need (a spare, with GTK up and
    /// no web view, see `window`) and sends this when there is something to show.
    Open {},
    /// Nothing to show for now: a spare gives back the pages it read to start (see `window`).
    Rest {},
    /// Show the window (made first if it is not), bring it forward and focus it.
    Show {},
    /// The window's title.
    Title {
        /// The text.
        title: String,
    },
}

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The other side closed the channel.
    #[error("the channel closed")]
    Closed,
    /// A line longer than [`MAX_LINE`].
    #[error("a message longer than {MAX_LINE} bytes")]
    TooLong,
    /// A line that is not one of the messages.
    #[error("not a message: {0}")]
    Malformed(String),
    /// Reading failed.
    #[error("reading the channel: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads the next message from `reader`, one line of at most [`MAX_LINE`] bytes.
pub async fn read<T, R>(reader: &mut R, line: &mut Vec<u8>) -> Result<T, ChannelError>
where
    T: for<'de> Deserialize<'de>,
    R: AsyncBufRead + Unpin,
{
    line.clear();
    let n = reader
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', line)
        .await?;
    if n == 0 {
        return Err(ChannelError::Closed);
    }
    if line.last() != Some(&b'\n') {
        return Err(if line.len() > MAX_LINE {
            ChannelError::TooLong
        } else {
            ChannelError::Closed
        });
    }
    serde_json::from_slice(line).map_err(|e| ChannelError::Malformed(e.to_string()))
}

/// `message` as one line.
pub fn line<T: Serialize>(message: &T) -> Vec<u8> {
    let mut line = serde_json::to_vec(message).expect("a channel message serializes");
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every message in `bytes`, each as [`read`] gave it, until the channel closes or a line is
    /// too long (the last then says so).
    async fn read_all<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Vec<Result<T, ChannelError>> {
        let mut reader = tokio::io::BufReader::new(bytes);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        loop {
            match read::<T, _>(&mut reader, &mut buf).await {
                Err(ChannelError::Closed) => return out,
                Err(ChannelError::TooLong) => {
                    out.push(Err(ChannelError::TooLong));
                    return out;
                }
                other => out.push(other),
            }
        }
    }

    #[tokio::test]
    async fn messages_cross_as_lines_both_ways() {
        let from = [
            FromWindow::Invoke {
                id: 7,
                command: "approve".into(),
                args: json!({"id": 3, "typedTarget": "a\nb"}),
            },
            FromWindow::Seen {
                visible: true,
                focused: false,
            },
            FromWindow::Loaded {},
        ];
        let bytes: Vec<u8> = from.iter().flat_map(line).collect();
        let read: Vec<FromWindow> = read_all(&bytes)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(read, from);
        let to = [
            ToWindow::Answer {
                id: 7,
                ok: Value::Null,
                err: None,
            },
            ToWindow::Answer {
                id: 8,
                ok: Value::Null,
                err: Some(json!({"code": "too_soon", "message": "wait", "wait_ms": 300})),
            },
            ToWindow::Emit {
                event: "queue://changed".into(),
                payload: json!([]),
            },
            ToWindow::Open {},
            ToWindow::Rest {},
            ToWindow::Show {},
            ToWindow::Title {
                title: "Countersign (1 pending)".into(),
            },
        ];
        let bytes: Vec<u8> = to.iter().flat_map(line).collect();
        let read: Vec<ToWindow> = read_all(&bytes)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(read, to);
    }

    #[tokio::test]
    async fn anything_else_is_refused_and_a_line_past_the_limit_ends_the_channel() {
        let bytes = b"{\"type\":\"approve\",\"id\":3}\n\
            {\"type\":\"loaded\",\"extra\":1}\n\
            {\"type\":\"seen\",\"visible\":\"yes\",\"focused\":true}\n\
            not json\n\
            {\"type\":\"loaded\"}\n";
        let read = read_all::<FromWindow>(bytes).await;
        assert_eq!(read.len(), 5);
        assert!(
            read[..4]
                .iter()
                .all(|r| matches!(r, Err(ChannelError::Malformed(_)))),
            "{read:?}"
        );
        assert!(matches!(read[4], Ok(FromWindow::Loaded {})), "{read:?}");
        // A half line at the end is the channel closing, not a message.
        assert!(
            read_all::<FromWindow>(b"{\"type\":\"loaded\"}")
                .await
                .is_empty()
        );
        let mut long = vec![b' '; MAX_LINE + 1];
        long.extend_from_slice(b"{\"type\":\"loaded\"}\n");
        let read = read_all::<FromWindow>(&long).await;
        assert!(
            matches!(read.as_slice(), [Err(ChannelError::TooLong)]),
            "{read:?}"
        );
    }
}
