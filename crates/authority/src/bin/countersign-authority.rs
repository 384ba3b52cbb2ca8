//! `countersign-authority`: the desk with no window, in a program that links no GUI toolkit.
//!
//! `countersign-desk` execs it, with the same arguments and environment, when no display is
//! named: the sockets and the sessions serve as in any desk, open tools work, and calls that need
//! approval are refused `desk_unavailable` (nothing here can show a request, so nothing here can
//! approve one). It can be run directly to the same effect.

use countersign_authority::desk;

fn main() {
    // SAFETY: first statement of main: no other thread exists yet to read the environment.
    let hardened = unsafe { countersign_authority::harden::harden() };
    let begun = desk::begin(&hardened);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("countersign-desk: no runtime: {e}");
            std::process::exit(1);
        }
    };
    let opened = desk::open(begun, false, rt.handle());
    desk::headless(opened, rt.handle());
}
