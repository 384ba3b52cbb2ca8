//! What asks the desk's registry: the command line over the desk's socket (`countersign`'s
//! `DeskAt`), the desk itself in its own process (Settings → Clients), or a stand-in in tests.
//!
//! The desk decides: a new server takes effect at once, a change or removal of an existing one
//! is shown in its window and takes effect only after the person's click. So a request may be
//! answered twice, first [`RegistryAnswer::Waiting`], then the outcome; [`Registrar::ask`]
//! returns the outcome.

use countersign_wire::{DeskError, RegistryAnswer, RegistryRequest};

/// Asks the desk's registry.
pub trait Registrar {
    /// Sends `request` and returns the final answer; `waiting` hears a
    /// [`RegistryAnswer::Waiting`]'s message when the person must decide first.
    fn ask(
        &mut self,
        request: RegistryRequest,
        waiting: &mut dyn FnMut(&str),
    ) -> Result<RegistryAnswer, DeskError>;
}
