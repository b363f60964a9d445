//! Principals: the person or system behind an API key. Two keys of one principal are one party
//! for no-self-review, so a principal has one spelling: it is normalised when a key is created
//! (Unicode NFKC, surrounding white space trimmed, inner runs of white space made one space,
//! case folded) and compared only in that form, here and in SQL.
//!
//! Refused outright: control characters, invisible format characters (zero-width spaces and
//! joiners, bidirectional overrides, the soft hyphen, the byte-order mark) and names that are
//! blank once trimmed.

use unicode_normalization::UnicodeNormalization;

/// Longest principal, in bytes, once normalised.
pub const MAX_PRINCIPAL_BYTES: usize = 128;

/// The canonical form of `raw`, or why it cannot be a principal.
pub fn normalise(raw: &str) -> Result<String, String> {
    if let Some(bad) = raw.chars().find(|c| c.is_control() || invisible(*c)) {
        return Err(format!(
            "principal must not contain control or invisible characters (found U+{:04X})",
            u32::from(bad)
        ));
    }
    let folded: String = raw.nfkc().flat_map(char::to_lowercase).collect();
    // Folding can leave a form that is not NFKC again (e.g. U+0130): normalise once more.
    let folded: String = folded.nfkc().collect();
    let spaced = folded.split_whitespace().collect::<Vec<_>>().join(" ");
    if spaced.is_empty() {
        return Err("principal must not be blank".to_owned());
    }
    if spaced.len() > MAX_PRINCIPAL_BYTES {
        return Err(format!(
            "principal must be at most {MAX_PRINCIPAL_BYTES} bytes once normalised"
        ));
    }
    Ok(spaced)
}

/// Characters that render as nothing, so two principals that look alike would differ.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFFB}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_one_principal_are_one_principal() {
        for variant in [
            "a1",
            "a1 ",
            " a1",
            "A1",
            "ａ１",
            "Ａ1",
            "\u{3000}a1\u{3000}",
            "a1\u{00A0}",
        ] {
            assert_eq!(normalise(variant).unwrap(), "a1", "{variant:?}");
        }
        assert_eq!(normalise("Ana  Ruiz").unwrap(), "ana ruiz");
        assert_eq!(normalise("STRASSE").unwrap(), "strasse");
        assert_eq!(normalise("ﬁle").unwrap(), "file");
        assert_ne!(normalise("a1").unwrap(), normalise("a2").unwrap());
    }

    #[test]
    fn control_invisible_and_blank_principals_are_refused() {
        for bad in [
            "",
            " ",
            "\u{3000}",
            "a\tb",
            "a\nb",
            "a1\u{0}",
            "a\u{200B}1",
            "\u{FEFF}a1",
            "a\u{202E}1",
            "a\u{00AD}1",
        ] {
            assert!(normalise(bad).is_err(), "{bad:?}");
        }
        assert!(normalise(&"p".repeat(MAX_PRINCIPAL_BYTES + 1)).is_err());
        assert!(normalise(&"P".repeat(MAX_PRINCIPAL_BYTES)).is_ok());
    }

    #[test]
    fn normalising_is_idempotent() {
        for raw in ["İstanbul", "ǅemal", "Ｍｉｘｅｄ　Ｃａｓｅ", "ß", "ΣΑΣ"] {
            let once = normalise(raw).unwrap();
            assert_eq!(normalise(&once).unwrap(), once, "{raw:?}");
        }
    }
}
