//! Closing the desk's window as a person does: the window manager's close button sends the
//! window a `WM_DELETE_WINDOW` message (ICCCM), and so does this, straight through the X server
//! the desk runs on. WebDriver cannot: its "close window" destroys the page, not the window.
//! And which windows are on the screen, by title, whether or not WebDriver knows of them.
#![allow(unsafe_code)] // test set-up reaches the OS (libc, the process environment); each block says why it is sound

use std::ffi::{CStr, CString};

use x11_dl::xlib;

/// The titles of the mapped top-level windows on `display`.
pub fn titles(display: &str) -> Vec<String> {
    let mut titles = Vec::new();
    each_mapped(display, |_, _, _, title| titles.push(title.to_owned()));
    titles
}

/// Asks every mapped top-level window on `display` whose title starts with `title` to close, as
/// a window manager's close button would; returns how many were asked.
pub fn close_by_title(display: &str, title: &str) -> usize {
    let mut asked = 0;
    each_mapped(display, |x, dpy, w, name| {
        if !name.starts_with(title) {
            return;
        }
        // SAFETY: `dpy` is the open connection `each_mapped` hands over, `w` one of its windows.
        unsafe {
            let protocols = (x.XInternAtom)(dpy, c"WM_PROTOCOLS".as_ptr(), 0);
            let delete = (x.XInternAtom)(dpy, c"WM_DELETE_WINDOW".as_ptr(), 0);
            let mut data = xlib::ClientMessageData::new();
            data.set_long(0, delete as std::os::raw::c_long);
            data.set_long(1, xlib::CurrentTime as std::os::raw::c_long);
            let message = xlib::XClientMessageEvent {
                type_: xlib::ClientMessage,
                serial: 0,
                send_event: 1,
                display: dpy,
                window: w,
                message_type: protocols,
                format: 32,
                data,
            };
            let mut event = xlib::XEvent::from(message);
            (x.XSendEvent)(dpy, w, 0, xlib::NoEventMask, &mut event);
        }
        asked += 1;
    });
    asked
}

/// Calls `each` with every mapped, named top-level window on `display` (and the connection),
/// then flushes what it sent and closes the connection.
fn each_mapped(
    display: &str,
    mut each: impl FnMut(&xlib::Xlib, *mut xlib::Display, xlib::Window, &str),
) {
    let x = xlib::Xlib::open().expect("libX11");
    let name = CString::new(display).unwrap();
    // SAFETY: plain Xlib calls on a connection opened and closed here; every pointer Xlib hands
    // back is read within its bounds and freed with XFree.
    unsafe {
        let dpy = (x.XOpenDisplay)(name.as_ptr());
        assert!(!dpy.is_null(), "cannot open display {display}");
        let root = (x.XDefaultRootWindow)(dpy);
        let (mut root_ret, mut parent, mut kids, mut n) = (0, 0, std::ptr::null_mut(), 0);
        (x.XQueryTree)(dpy, root, &mut root_ret, &mut parent, &mut kids, &mut n);
        let windows: Vec<xlib::Window> = if kids.is_null() {
            Vec::new()
        } else {
            let list = std::slice::from_raw_parts(kids, n as usize).to_vec();
            (x.XFree)(kids.cast());
            list
        };
        for w in windows {
            let mut attrs: xlib::XWindowAttributes = std::mem::zeroed();
            if (x.XGetWindowAttributes)(dpy, w, &mut attrs) == 0
                || attrs.map_state != xlib::IsViewable
            {
                continue;
            }
            let mut raw = std::ptr::null_mut();
            if (x.XFetchName)(dpy, w, &mut raw) == 0 || raw.is_null() {
                continue;
            }
            let title = CStr::from_ptr(raw).to_string_lossy().into_owned();
            (x.XFree)(raw.cast());
            each(&x, dpy, w, &title);
        }
        (x.XSync)(dpy, 0);
        (x.XCloseDisplay)(dpy);
    }
}
