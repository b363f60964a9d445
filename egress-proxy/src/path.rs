//! The one path a request rule decides on and the upstream receives (issue 21, item 2).
//!
//! A rule that allows `GET /repos/` must not allow `/repos/../admin`, `/repos/%2e%2e/admin` or
//! `/repos/..%2fadmin`, which a server resolves to `/admin`. So the proxy normalises a request's
//! path before the policy sees it, and forwards exactly the normalised path (with the query as
//! it came): what the upstream is asked for is what was decided.
//!
//! The rule, in order, on the path of the request target (the part before `?`):
//! 1. it must begin with `/` and hold only visible ASCII (no `\`, no space, no control
//!    character); a visible character a path may not hold as it is (`"`, `<`, `>`, `{`, ...)
//!    is escaped, as a browser or server would;
//! 2. each `%XX` must be two hex digits. An escape of an unreserved character
//!    (`A-Z a-z 0-9 - . _ ~`, RFC 3986 section 2.3) is decoded; any other escape is kept, its hex
//!    digits upper case. Refused: an escape of `/` (`%2F`), `\` (`%5C`), NUL (`%00`) or any other
//!    control byte, and `%25` followed by two hex digits (`%252e`, which a server that decodes
//!    twice reads as `.`);
//! 3. a segment that is `.` or `..` once a `;parameter` is cut off (`..;x`, which Tomcat and
//!    Spring read as `..`) but is not exactly `.` or `..` is refused;
//! 4. dot segments are removed (RFC 3986 section 5.2.4): `/a/./b` is `/a/b`, `/a/b/../c` is
//!    `/a/c`, and `..` at the root stays at the root.
//!
//! The result has no dot segment in any spelling, no escape that decodes to one, and nothing a
//! server could decode into a separator: decoding it again, merging slashes or removing dot
//! segments (what servers do) never moves it to another place.

use thiserror::Error;

/// Longest normalised path the proxy decides on and forwards; longer ones are refused rather
/// than cut (a cut path would be decided on and forwarded differently).
pub const MAX_PATH: usize = 8192;

/// Why a path is refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PathError {
    #[error("the path must begin with /")]
    NotAbsolute,
    #[error("the path is longer than {MAX_PATH} bytes")]
    TooLong,
    #[error("the path holds a byte a path may not hold ({0:#04x})")]
    BadByte(u8),
    #[error("the path holds a % that does not begin two hex digits")]
    BadEscape,
    #[error("the path holds an encoded {0}, which servers read differently")]
    Refused(&'static str),
    #[error(
        "the path holds a dot segment with a parameter (`..;`), which some servers read as `..`"
    )]
    DotParameter,
}

/// The normalised form of `path` (the request target's path, without the query).
pub fn normalise(path: &str) -> Result<String, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let mut segments: Vec<String> = Vec::new();
    let mut raw = path[1..].split('/').peekable();
    while let Some(segment) = raw.next() {
        let segment = decode_segment(segment)?;
        let last = raw.peek().is_none();
        match segment.as_str() {
            "." | ".." => {
                if segment == ".." {
                    segments.pop();
                }
                // `/a/b/..` is `/a/`: a dot segment at the end leaves the directory.
                if last {
                    segments.push(String::new());
                }
            }
            _ => {
                if is_dot_with_parameter(&segment) {
                    return Err(PathError::DotParameter);
                }
                segments.push(segment);
            }
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    if out.is_empty() {
        out.push('/');
    }
    if out.len() > MAX_PATH {
        return Err(PathError::TooLong);
    }
    Ok(out)
}

/// `..;x` or `.;x`: a dot segment once its `;parameter` is cut.
fn is_dot_with_parameter(segment: &str) -> bool {
    // `%3B` too: a server that decodes before it cuts parameters reads it as `;`.
    let plain = segment.replace("%3B", ";");
    let name = plain.split(';').next().unwrap_or(&plain);
    plain.contains(';') && (name == "." || name == "..")
}

/// One segment with unreserved escapes decoded and the others checked and upper-cased.
fn decode_segment(segment: &str) -> Result<String, PathError> {
    let bytes = segment.as_bytes();
    let mut out = String::with_capacity(segment.len());
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte != b'%' {
            if !byte.is_ascii_graphic() || byte == b'\\' {
                return Err(PathError::BadByte(byte));
            }
            if is_pchar(byte) {
                out.push(char::from(byte));
            } else {
                // `"`, `<`, `>`, `{`, ...: servers escape them; the policy sees the escape.
                out.push_str(&format!("%{byte:02X}"));
            }
            i += 1;
            continue;
        }
        let decoded = hex_pair(bytes.get(i + 1..i + 3)).ok_or(PathError::BadEscape)?;
        match decoded {
            b'/' => return Err(PathError::Refused("/ (%2F)")),
            b'\\' => return Err(PathError::Refused("\\ (%5C)")),
            0 => return Err(PathError::Refused("NUL (%00)")),
            b'%' if hex_pair(bytes.get(i + 3..i + 5)).is_some() => {
                return Err(PathError::Refused("% that begins another escape (%25XX)"))
            }
            control if control < 0x20 || control == 0x7f => {
                return Err(PathError::Refused("control character"))
            }
            unreserved if is_unreserved(unreserved) => out.push(char::from(unreserved)),
            other => out.push_str(&format!("%{other:02X}")),
        }
        i += 3;
    }
    // Again on the result: `%25%32%65` decodes to `%252e` (found by the fuzzer), which a server
    // that decodes twice reads as `.`.
    let escapes_twice = out
        .match_indices("%25")
        .any(|(at, _)| hex_pair(out.as_bytes().get(at + 3..at + 5)).is_some());
    if escapes_twice {
        return Err(PathError::Refused("% that begins another escape (%25XX)"));
    }
    Ok(out)
}

fn hex_pair(pair: Option<&[u8]>) -> Option<u8> {
    let pair = pair?;
    let digit = |b: u8| char::from(b).to_digit(16);
    let (high, low) = (digit(pair[0])?, digit(pair[1])?);
    u8::try_from(high * 16 + low).ok()
}

/// A character RFC 3986 allows as it is in a path segment (`pchar` but `%`).
fn is_pchar(byte: u8) -> bool {
    is_unreserved(byte) || b"!$&'()*+,;=:@".contains(&byte)
}

fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walks_of_issue_21_resolve_or_are_refused() {
        assert_eq!(normalise("/repos/../admin/users").unwrap(), "/admin/users");
        assert_eq!(normalise("/repos/%2e%2e/admin").unwrap(), "/admin");
        assert_eq!(normalise("/repos/%2E./admin").unwrap(), "/admin");
        assert_eq!(
            normalise("/repos/..%2fadmin"),
            Err(PathError::Refused("/ (%2F)"))
        );
        assert_eq!(
            normalise("/repos/..%5cadmin"),
            Err(PathError::Refused("\\ (%5C)"))
        );
        assert_eq!(
            normalise("/repos/..\\admin"),
            Err(PathError::BadByte(b'\\'))
        );
        assert_eq!(normalise("/repos/..;/admin"), Err(PathError::DotParameter));
        assert_eq!(
            normalise("/repos/.%2e%3bx/admin"),
            Err(PathError::DotParameter)
        );
        assert_eq!(
            normalise("/repos/a%00"),
            Err(PathError::Refused("NUL (%00)"))
        );
        assert!(normalise("/repos/%252e%252e/admin").is_err());
        assert!(normalise("/repos/%25%32%65%25%32%65/admin").is_err());
        assert!(normalise("/a/%25%41%41").is_err());
        assert_eq!(normalise("/repos/%zz"), Err(PathError::BadEscape));
        assert_eq!(normalise("/repos/%2"), Err(PathError::BadEscape));
        assert_eq!(normalise("repos"), Err(PathError::NotAbsolute));
        assert_eq!(normalise("*"), Err(PathError::NotAbsolute));
    }

    #[test]
    fn ordinary_paths_keep_their_shape() {
        for (raw, normal) in [
            ("/", "/"),
            ("/repos/acme/app", "/repos/acme/app"),
            ("/repos/", "/repos/"),
            ("/a/./b", "/a/b"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/..", "/"),
            ("/../../etc", "/etc"),
            ("/a//b", "/a//b"),
            ("/a/%7euser", "/a/~user"),
            ("/a/%41%2d", "/a/A-"),
            ("/a/%3b%3f%20x", "/a/%3B%3F%20x"),
            ("/a/b;v=1/c", "/a/b;v=1/c"),
            ("/a/%25", "/a/%25"),
            ("/a/%25zz", "/a/%25zz"),
            ("/a/%c3%a9", "/a/%C3%A9"),
            ("/a/<b>", "/a/%3Cb%3E"),
            ("/a/%3e", "/a/%3E"),
        ] {
            assert_eq!(normalise(raw).as_deref(), Ok(normal), "{raw}");
        }
        assert_eq!(
            normalise(&format!("/{}", "a".repeat(MAX_PATH))),
            Err(PathError::TooLong)
        );
    }
}
