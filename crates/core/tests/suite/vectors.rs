//! Published test vectors: RFC 8785 canonical JSON and RFC 4231 HMAC-SHA256.
//!
//! Both are copied into `tests/vectors/` (see its README for their source and licence) so the
//! core's two cryptographic foundations are pinned to outside references, not to our own output.

use std::path::PathBuf;

use countersign_core::canonical;
use countersign_core::token::hmac_sha256;

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

#[test]
fn every_rfc_8785_vector_canonicalizes_to_its_expected_bytes() {
    let dir = vectors().join("jcs");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir.join("input")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        let input = std::fs::read_to_string(&path).unwrap();
        let expected = std::fs::read(dir.join("output").join(name)).unwrap();
        let value = canonical::parse_strict(&input).unwrap_or_else(|e| panic!("{name:?}: {e}"));
        let actual = canonical::to_string(&value).unwrap();
        assert_eq!(actual.as_bytes(), expected.as_slice(), "{name:?}");
        checked += 1;
    }
    assert_eq!(checked, 6, "all six published vectors are present");
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn hmac_sha256_matches_every_rfc_4231_vector() {
    let text = std::fs::read_to_string(vectors().join("hmac-sha256-rfc4231.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = doc["vectors"].as_array().unwrap();
    assert_eq!(cases.len(), 6);
    for case in cases {
        let key = unhex(case["key_hex"].as_str().unwrap());
        let data = unhex(case["data_hex"].as_str().unwrap());
        let expected = unhex(case["hmac_sha256_hex"].as_str().unwrap());
        assert_eq!(
            hmac_sha256(&key, &data).as_slice(),
            expected.as_slice(),
            "case {}",
            case["case"]
        );
    }
}
