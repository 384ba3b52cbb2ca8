//! Any bytes on the desk's socket are refused with a typed error or decode to a frame that
//! encodes and decodes back to itself; reading them as a stream of frames never panics and never
//! holds more memory than the bytes that arrived.
#![no_main]

use std::sync::OnceLock;

use countersign_wire::{decode, encode, read_frame_within};
use libfuzzer_sys::fuzz_target;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    // The body of one frame, as the socket reader hands it over.
    if let Ok(frame) = decode(data) {
        let bytes = encode(&frame).expect("a decoded frame encodes");
        let again = decode(&bytes[4..]).expect("an encoded frame decodes");
        assert_eq!(again, frame, "a frame changed on its way through encode and decode");
    }
    // The same bytes as a stream: length prefixes, bodies, and whatever is cut short.
    runtime().block_on(async {
        let mut reader = data;
        for _ in 0..64 {
            match read_frame_within(&mut reader, Some(std::time::Duration::from_secs(1))).await {
                Ok(_) => continue,
                Err(_) => break,
            }
        }
    });
});
