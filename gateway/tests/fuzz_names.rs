//! Fuzzing of the upload-name checks (`gateway::app::validate::normalise_path`): every name an
//! agent gives a file is checked here before anything is written under `/workspace`.
//! Property-based (proptest); `cargo test` runs proptest's default number of cases, `make fuzz`
//! many more (`PROPTEST_CASES`). Names are arbitrary text and concatenations of pieces chosen
//! to hit the rules: dots and slashes in every spelling (fullwidth, one-dot leaders, small full
//! stops), percent-encodings of them (once and twice, and of their UTF-8), backslashes,
//! combining marks. Failures found are saved in `tests/fuzz_names.proptest-regressions` and
//! replayed first: commit that file.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

use proptest::prelude::*;
use unicode_normalization::UnicodeNormalization;

use gateway::app::validate::normalise_path;

/// Pieces of names: separators and dots in many spellings, and plain text.
const PIECES: &[&str] = &[
    "..",
    ".",
    "/",
    "\\",
    "a",
    "b.csv",
    "%",
    "2e",
    "2f",
    "%2e",
    "%2E",
    "%2f",
    "%2F",
    "%25",
    "%5c",
    "\u{ff0e}",
    "\u{ff0f}",
    "\u{2024}",
    "\u{2025}",
    "\u{fe52}",
    "\u{ff3c}",
    "%EF%BC%8E",
    "%EF%BC%8F",
    "%E2%80%A4",
    "\u{301}",
    "e\u{301}",
    "%00",
    "\u{0}",
    " ",
    "~",
];

/// Every form a consumer might turn `name` into: percent-decoded and NFKC-normalised, applied
/// repeatedly (at most 8 rounds, or until nothing changes).
fn forms(name: &str) -> Vec<String> {
    let mut out = vec![name.to_owned()];
    let mut current = name.to_owned();
    for _ in 0..8 {
        let next: String = decode(&current).nfkc().collect();
        if next == current {
            break;
        }
        out.push(next.clone());
        current = next;
    }
    out
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let pair = bytes
            .get(i + 1..i + 3)
            .and_then(|p| std::str::from_utf8(p).ok());
        match (bytes[i], pair.and_then(|p| u8::from_str_radix(p, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a form could leave `/workspace` or name something odd there.
fn escapes(form: &str) -> bool {
    form.starts_with('/')
        || form.chars().any(char::is_control)
        || form
            .split(['/', '\\'])
            .any(|part| part.is_empty() || part == "." || part == "..")
}

fn check(name: &str) -> Result<(), TestCaseError> {
    let Ok(stored) = normalise_path(name) else {
        return Ok(());
    };
    prop_assert!(!stored.is_empty() && stored.len() <= 255, "{stored:?}");
    prop_assert_eq!(
        stored.nfc().collect::<String>(),
        stored.clone(),
        "stored as NFC"
    );
    for form in forms(&stored).iter().chain(forms(name).iter()) {
        prop_assert!(
            !escapes(form),
            "{name:?} accepted, but a form of it is {form:?}"
        );
    }
    prop_assert_eq!(
        normalise_path(&stored).ok(),
        Some(stored.clone()),
        "idempotent"
    );
    Ok(())
}

proptest! {
    #[test]
    fn arbitrary_names(name in "\\PC{0,40}") {
        check(&name)?;
    }

    #[test]
    fn names_built_from_tricky_pieces(indices in proptest::collection::vec(0..PIECES.len(), 1..10)) {
        let name: String = indices.iter().map(|&i| PIECES[i]).collect();
        check(&name)?;
    }
}

#[test]
fn known_smuggling_spellings_are_refused() {
    for bad in [
        "%252e%252e/x",         // encoded twice
        "%EF%BC%8E%EF%BC%8E/x", // encoded fullwidth dots
        "%E2%80%A5/x",          // an encoded two-dot leader
        "a/%2e%2e%5cb",
        "%5c\u{301}", // decodes to a backslash before the accent composes
    ] {
        assert!(normalise_path(bad).is_err(), "{bad:?} accepted");
    }
    assert_eq!(normalise_path("100%.txt").unwrap(), "100%.txt");
    assert_eq!(
        normalise_path("report 2024.csv").unwrap(),
        "report 2024.csv"
    );
}
