//! Checks of an execution request before it reaches the policy: bounded free-text fields, and
//! upload names that stay inside `/workspace` however they are spelt.

use base64::Engine as _;

use super::refusals::{bounded_text, Refusal, RefusalKind, Verdict};
use super::request::{ExecutionRequest, FileUpload};
use super::{App, AppError};
use crate::audit::ApiKey;

const MAX_FILES: usize = 256;
/// Most labels, and most network destinations, in one request.
const MAX_LABELS: usize = 32;
const MAX_PATH_BYTES: usize = 255;
/// Rounds of percent-decoding an upload name is checked through (see [`normalise_path`]).
const MAX_DECODE_ROUNDS: usize = 4;

/// Bounds and checks the request's free-text fields before they reach the policy input and the
/// audit rows (PostgreSQL's jsonb refuses NUL, and nothing else should carry control
/// characters either).
pub(super) fn check_fields(request: &ExecutionRequest) -> Result<(), AppError> {
    let text = |what: &str, value: &str, max: usize| {
        if value.len() > max || value.chars().any(char::is_control) {
            return Err(AppError::Invalid(format!(
                "{what} must be at most {max} bytes without control characters"
            )));
        }
        Ok(())
    };
    text("language", &request.language, 32)?;
    if request.labels.len() > MAX_LABELS || request.network.len() > MAX_LABELS {
        return Err(AppError::Invalid(format!(
            "at most {MAX_LABELS} labels and {MAX_LABELS} network destinations"
        )));
    }
    for (key, value) in &request.labels {
        text("a label key", key, 63)?;
        text("a label value", value, 256)?;
    }
    for destination in &request.network {
        text("a network host", &destination.host, 253)?;
    }
    for mount in &request.mounts {
        text("a mount", mount, 128)?;
    }
    Ok(())
}

/// Why an upload was refused. Both are 400; a traversal is also audited as a hostile refusal.
#[derive(Debug)]
pub enum UploadError {
    /// A name that would leave `/workspace` (absolute, `..`, `.`, empty parts, a backslash),
    /// however it is spelt.
    Traversal {
        name: String,
        message: String,
    },
    Invalid(String),
}

impl From<UploadError> for AppError {
    fn from(err: UploadError) -> AppError {
        match err {
            UploadError::Traversal { message, .. } | UploadError::Invalid(message) => {
                AppError::Invalid(message)
            }
        }
    }
}

impl App {
    /// [`decode_files`], with a traversal attempt audited (bounded, see `refusals`) before the
    /// 400; past the caller's rate it is a 429.
    pub(super) async fn checked_uploads(
        &self,
        caller: &ApiKey,
        files: &[FileUpload],
    ) -> Result<Vec<(String, Vec<u8>)>, AppError> {
        let err = match decode_files(files) {
            Ok(files) => return Ok(files),
            Err(err) => err,
        };
        if let UploadError::Traversal { name, .. } = &err {
            let refusal = Refusal {
                kind: RefusalKind::UploadTraversal,
                source: None,
                key_id: Some(caller.id.clone()),
                tenant: Some(caller.tenant.clone()),
                code: "request.path_traversal".to_owned(),
                detail: serde_json::json!({"file": bounded_text(name)}),
            };
            if let Verdict::Throttled { .. } = self.refuse(refusal).await? {
                return Err(AppError::RateLimited(
                    "too many refused uploads from this key".to_owned(),
                ));
            }
        }
        Err(err.into())
    }
}

/// Decodes uploads and checks their names: relative, inside `/workspace`, bounded.
pub(super) fn decode_files(files: &[FileUpload]) -> Result<Vec<(String, Vec<u8>)>, UploadError> {
    if files.len() > MAX_FILES {
        return Err(UploadError::Invalid(format!(
            "{} files; the limit is {MAX_FILES}",
            files.len()
        )));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut seen = std::collections::HashSet::new();
    files
        .iter()
        .map(|file| {
            let path = normalise_path(&file.path)?;
            if !seen.insert(path.clone()) {
                return Err(UploadError::Invalid(format!(
                    "file {:?}: given more than once",
                    file.path
                )));
            }
            let content = b64.decode(&file.content_b64).map_err(|err| {
                UploadError::Invalid(format!(
                    "file {:?}: content_b64 is not base64 ({}); use the standard alphabet \
                     (A-Z a-z 0-9 + /) with = padding and no spaces or line breaks",
                    file.path,
                    base64_problem(&err)
                ))
            })?;
            Ok((path, content))
        })
        .collect()
}

/// What is wrong with a base64 text, in words (the crate's own text says "Invalid symbol 32").
fn base64_problem(err: &base64::DecodeError) -> String {
    match err {
        base64::DecodeError::InvalidByte(offset, byte)
        | base64::DecodeError::InvalidLastSymbol(offset, byte) => {
            format!("character {:?} at offset {offset}", char::from(*byte))
        }
        base64::DecodeError::InvalidLength(length) => {
            format!("{length} characters, a length no padding can make whole")
        }
        base64::DecodeError::InvalidPadding => "wrong or missing = padding".to_owned(),
    }
}

/// The name a file is written under: its NFC form, once that form, its compatibility (NFKC)
/// form and every form reached by percent-decoding and NFKC-normalising again (until nothing
/// changes, at most [`MAX_DECODE_ROUNDS`] rounds; a name still changing after that is refused),
/// from the name as sent and from its NFKC form, all pass [`check_path`]. So look-alikes
/// (fullwidth dots and slashes), encoded separators (`%2e%2e/x`), names encoded twice
/// (`%252e%252e/x`), encoded look-alikes (`%EF%BC%8E%EF%BC%8E/x`) and encodings that
/// composing hides (`%5c` and a combining accent) cannot smuggle a traversal past the check
/// into something that later normalises or decodes it. (Found by `gateway/tests/fuzz_names.rs`.)
pub fn normalise_path(path: &str) -> Result<String, UploadError> {
    use unicode_normalization::UnicodeNormalization;
    let refuse = |fault: NameFault| {
        let message = format!("file {path:?}: {}", fault.why());
        match fault {
            NameFault::Escapes(_) => UploadError::Traversal {
                name: path.to_owned(),
                message,
            },
            NameFault::Malformed(_) => UploadError::Invalid(message),
        }
    };
    let nfc: String = path.nfc().collect();
    check_path(&nfc).map_err(refuse)?;
    let nfkc: String = path.nfkc().collect();
    for start in [path.to_owned(), nfkc] {
        decoded_forms_pass(start).map_err(refuse)?;
    }
    Ok(nfc)
}

/// Checks `form` and every form reached from it by percent-decoding, then NFKC, until nothing
/// changes (at most [`MAX_DECODE_ROUNDS`] rounds).
fn decoded_forms_pass(mut form: String) -> Result<(), NameFault> {
    use unicode_normalization::UnicodeNormalization;
    check_path(&form)?;
    for _ in 0..MAX_DECODE_ROUNDS {
        let decoded = percent_decode(&form);
        check_path(&decoded)?;
        let next: String = decoded.nfkc().collect();
        check_path(&next)?;
        if next == form {
            return Ok(());
        }
        form = next;
    }
    Err(NameFault::Escapes(
        "path is still percent-encoded after several rounds of decoding",
    ))
}

/// What is wrong with an upload name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameFault {
    /// It would leave `/workspace`: a traversal attempt.
    Escapes(&'static str),
    Malformed(&'static str),
}

impl NameFault {
    fn why(self) -> &'static str {
        match self {
            NameFault::Escapes(why) | NameFault::Malformed(why) => why,
        }
    }
}

/// `%XX` sequences decoded (lossily); anything else kept.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|pair| std::str::from_utf8(pair).ok())
            .and_then(|pair| u8::from_str_radix(pair, 16).ok());
        match (bytes[i], hex) {
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

fn check_path(path: &str) -> Result<(), NameFault> {
    if path.is_empty() || path.len() > MAX_PATH_BYTES {
        return Err(NameFault::Malformed("path must be 1 to 255 bytes"));
    }
    if path.chars().any(char::is_control) {
        return Err(NameFault::Malformed(
            "path must not contain control characters",
        ));
    }
    if path.starts_with('/') {
        return Err(NameFault::Escapes("path must be relative to /workspace"));
    }
    if path.contains('\\') {
        return Err(NameFault::Escapes("path must not contain a backslash"));
    }
    if path
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(NameFault::Escapes(
            "path must not contain empty, '.' or '..' components",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_paths_are_checked() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "./a",
            "a\0b",
            "a\nb",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["data.csv", "src/main.py", "a.b/c"] {
            assert!(check_path(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn file_names_are_checked_after_normalisation_and_decoding() {
        for bad in [
            "\u{ff0e}\u{ff0e}/x",   // fullwidth dots
            "a\u{ff0f}..\u{ff0f}b", // fullwidth slashes
            "%2e%2e/x",
            "%2E%2E%2Fetc",
            "a%2f..%2f..%2fb",
            "x%00y",
            "..\\x",
            "\u{2024}\u{2024}/x", // one-dot leaders: NFKC gives '.'
        ] {
            assert!(normalise_path(bad).is_err(), "{bad:?} accepted");
        }
        // Decomposed é is stored composed (NFC), and plain percent signs are fine.
        assert_eq!(normalise_path("cafe\u{301}.csv").unwrap(), "caf\u{e9}.csv");
        assert_eq!(normalise_path("100%.txt").unwrap(), "100%.txt");
    }
}
