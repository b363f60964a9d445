//! Serde's error text made readable for the people who wrote the input: Rust type names
//! (`expected usize`, `expected struct HostPort`) become what to write instead. Used for
//! request bodies, query strings and the config file alike, so no Rust type name reaches a
//! client or an operator.

/// What each Rust type serde may name in `expected ...` means to a person.
const TYPE_WORDS: &[(&str, &str)] = &[
    ("usize", "a whole number (0 or more)"),
    ("u64", "a whole number (0 or more)"),
    ("u32", "a whole number from 0 to 4294967295"),
    ("u16", "a whole number from 0 to 65535"),
    ("u8", "a whole number from 0 to 255"),
    ("i64", "a whole number"),
    ("i32", "a whole number"),
    ("f64", "a number"),
    ("f32", "a number"),
    ("a boolean", "true or false"),
    ("a sequence", "a list"),
    ("a map", "a mapping of names to values"),
];

/// `message` with every `expected <rust type>` replaced, and serde's `struct X`/`enum X`
/// spelled as what the input should be.
pub fn plain(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("expected ") {
        let (before, after) = rest.split_at(at + "expected ".len());
        out.push_str(before);
        rest = replace_type(after, &mut out);
    }
    out.push_str(rest);
    out
}

/// Writes the plain form of the type at the start of `text` to `out`; returns what follows.
fn replace_type<'a>(text: &'a str, out: &mut String) -> &'a str {
    for (prefix, plain) in [
        ("struct ", "an object (a mapping)"),
        ("enum ", "one of the allowed values"),
    ] {
        if let Some(rest) = text.strip_prefix(prefix) {
            out.push_str(plain);
            return rest.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_');
        }
    }
    for (word, plain) in TYPE_WORDS {
        if let Some(rest) = text.strip_prefix(word) {
            if !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
                out.push_str(plain);
                return rest;
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::plain;

    #[test]
    fn rust_type_names_become_what_to_write() {
        assert_eq!(
            plain("invalid type: string \"lots\", expected usize"),
            "invalid type: string \"lots\", expected a whole number (0 or more)"
        );
        assert_eq!(
            plain("network[0]: invalid type: string \"x\", expected struct HostPort at line 1"),
            "network[0]: invalid type: string \"x\", expected an object (a mapping) at line 1"
        );
        assert_eq!(
            plain("expected u16"),
            "expected a whole number from 0 to 65535"
        );
        assert_eq!(plain("expected u64s"), "expected u64s");
        assert_eq!(
            plain("unknown field `timeout`, expected one of `timeout_ms`, `memory_mb`"),
            "unknown field `timeout`, expected one of `timeout_ms`, `memory_mb`"
        );
    }
}
