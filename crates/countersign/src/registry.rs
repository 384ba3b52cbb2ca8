//! The command line's side of the registry: one request to the desk over its socket, and the
//! answers, for `countersign server ...` and `countersign install` (the [`Registrar`] that reaches
//! the desk from outside it).
//!
//! The desk decides: a new server takes effect at once, a change or removal of an existing one
//! is shown in its window and takes effect only after the person's click. So a request may be
//! answered twice, first [`RegistryAnswer::Waiting`], then the outcome; this waits for both.
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use std::io::BufReader;
use std::path::PathBuf;

use countersign_clients::Registrar;
use countersign_wire::{
    DeskError, Frame, Hello, PROTOCOL_VERSION, RegistryAnswer, RegistryRequest,
};

use countersign_pipe as pipe;

/// Where the desk is, and whether to start it when none answers.
#[derive(Debug, Clone)]
pub struct DeskAt {
    /// Its socket.
    pub socket: PathBuf,
    /// Which flag or variable chose the socket (no desk is started for one so chosen).
    pub socket_chosen_by: Option<&'static str>,
    /// Whether to start a desk when none answers at the computed path.
    pub launch_desk: bool,
}

impl DeskAt {
    /// This account's desk: `$COUNTERSIGN_SOCKET` when set (no desk started there), else the
    /// socket computed from the user id, starting the desk when none answers.
    pub fn default_desk() -> Self {
        match countersign_wire::socket_override() {
            Some(socket) => DeskAt {
                socket,
                socket_chosen_by: Some(countersign_wire::SOCKET_ENV),
                launch_desk: false,
            },
            None => DeskAt {
                socket: countersign_wire::default_socket_path(),
                socket_chosen_by: None,
                launch_desk: true,
            },
        }
    }
}

impl Registrar for DeskAt {
    fn ask(
        &mut self,
        request: RegistryRequest,
        waiting: &mut dyn FnMut(&str),
    ) -> Result<RegistryAnswer, DeskError> {
        let options = pipe::Options {
            reach: countersign_wire::Reach::Server {
                name: String::new(),
            },
            label: None,
            wait: None,
            socket: self.socket.clone(),
            socket_chosen_by: self.socket_chosen_by,
            launch_desk: self.launch_desk,
            // SAFETY: getuid has no preconditions and cannot fail.
            desk_uid: unsafe { libc::getuid() },
            relay: true,
        };
        let stream = pipe::connect(&options)?;
        let mut to_desk = stream.try_clone().map_err(pipe::lost)?;
        let mut from_desk = BufReader::new(stream);
        let hello = Frame::Hello(Hello::Registry {
            version: PROTOCOL_VERSION,
            request,
        });
        pipe::write_frame(&mut to_desk, &hello).map_err(pipe::lost)?;
        loop {
            match pipe::read_frame(&mut from_desk).map_err(pipe::lost)? {
                Some(Frame::Registry(RegistryAnswer::Waiting { message })) => waiting(&message),
                Some(Frame::Registry(answer)) => return Ok(answer),
                // A desk of another version refuses the hello with a welcome.
                Some(Frame::Welcome(countersign_wire::Welcome::Refused { code, message })) => {
                    return Err(DeskError::Refused {
                        code: code.code(),
                        message,
                    });
                }
                Some(other) => return Err(pipe::lost(format!("unexpected {other:?}"))),
                None => {
                    return Err(pipe::lost(
                        "the desk closed the connection before it answered (a desk restart \
                         drops a change that was waiting for the person)",
                    ));
                }
            }
        }
    }
}
