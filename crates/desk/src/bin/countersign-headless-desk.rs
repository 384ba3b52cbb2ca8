//! `countersign-headless-desk`: the desk, in a program that links no GUI toolkit.
//!
//! `countersign-desk` execs it, with the same arguments and environment, whenever it is started as
//! anything but the desk's window. With a display named it runs the desk with its tray and starts
//! its window's process when there is something to show (`countersign_headless_desk::window`); with
//! none, the sockets and the sessions serve as in any desk, open tools work, and calls that need
//! approval are refused `desk_unavailable` (nothing could show a request, so nothing can approve
//! one).
#![allow(unsafe_code)] // this module reaches the OS through libc; each unsafe block says why it is sound

use countersign_headless_desk::start;
use countersign_headless_desk::window;

fn main() {
    // SAFETY: first statement of main: no other thread exists yet to read the environment.
    let hardened = unsafe { start::harden::harden() };
    let begun = start::begin(&hardened);
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
    let window = start::has_display();
    let in_tray = begun.in_tray;
    let release_after = window::idle::release_after(begun.settings.release_after_s);
    let opened = start::open(begun, window, rt.handle());
    if window {
        window::run(opened, in_tray, release_after, rt.handle());
    } else {
        start::headless(opened, rt.handle());
    }
    // Work still on the blocking pool (a keychain that does not answer) does not hold the exit.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
}
