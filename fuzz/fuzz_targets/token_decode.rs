//! Any string handed to the token decoder is refused or decodes to claims that re-mint to the
//! very same string: one token, one spelling. It never panics.
#![no_main]

use countersign_core::token::{SigningKey, decode, mint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = SigningKey::new(&[0x24; 32]).unwrap();
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(claims) = decode(&key, text) {
        assert_eq!(mint(&key, &claims).expose(), text, "a second spelling of a valid token");
    }
    // The claim parser sits behind the signature; feed it the bytes directly as well.
    let _ = serde_json::from_slice::<countersign_core::token::Claims>(data);
});
