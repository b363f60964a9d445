//! Host canonicalisation: the one spelling of a destination that the policy decides on, the
//! resolver looks up and the audit row names.
//!
//! The rules follow the WHATWG URL host parser (what browsers and most HTTP clients do), made
//! stricter where a lenient parser would let a sandbox smuggle a second meaning past the policy:
//! - a name goes through IDNA (UTS 46, as in URLs) to its ASCII (punycode) form, lower case, and
//!   loses one trailing dot; what is left must be labels of `[a-z0-9_-]`, 1-63 long, 253 in all;
//! - a name whose last label is a number is an IPv4 literal in one of the `inet_aton` spellings
//!   (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`) and becomes dotted-quad, or is refused when it
//!   is not a valid one (`1.2.3.256`, `example.123`): no string that an OS resolver would read as
//!   an address ever reaches a resolver as a name;
//! - an IPv6 literal is written in brackets; one that maps an IPv4 address (`::ffff:a.b.c.d`) is
//!   that IPv4 address; zone ids (`%25eth0`) are refused;
//! - control characters, whitespace, `%`, `@`, `\`, `/` and stray `:` are refused outright.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest host accepted before any work is done on it.
const MAX_RAW_LEN: usize = 1024;
/// Longest DNS name, dots included (after IDNA).
const MAX_NAME_LEN: usize = 253;
/// Longest DNS label.
const MAX_LABEL_LEN: usize = 63;

/// A canonical destination host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name: ASCII, lower case, no trailing dot.
    Name(String),
    /// An IP literal (IPv4-mapped IPv6 literals are stored as IPv4).
    Ip(IpAddr),
}

impl Host {
    /// The form written in a URL authority or a `Host` header: IPv6 in brackets.
    pub fn authority(&self, port: u16, default_port: u16) -> String {
        let host = match self {
            Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
            other => other.to_string(),
        };
        if port == default_port {
            host
        } else {
            format!("{host}:{port}")
        }
    }
}

/// The policy's view: a name, a dotted quad, or an IPv6 address without brackets.
impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Why a host was refused before any policy decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("host is empty")]
    Empty,
    #[error("host is longer than {MAX_RAW_LEN} bytes")]
    TooLong,
    #[error("host contains a control character or whitespace")]
    ControlCharacter,
    #[error("host contains {0:?}, which no host name may contain")]
    ForbiddenCharacter(char),
    #[error("IPv6 zone ids are refused")]
    ZoneId,
    #[error("host is not a valid IPv6 literal")]
    InvalidIpv6,
    #[error("host ends in a number but is not a valid IPv4 address")]
    InvalidIpv4,
    #[error("host is not a valid international domain name")]
    Idna,
    #[error("host has an empty label")]
    EmptyLabel,
    #[error("host has a label longer than {MAX_LABEL_LEN} characters")]
    LabelTooLong,
    #[error("host is longer than {MAX_NAME_LEN} characters")]
    NameTooLong,
    #[error("host has a character outside a-z, 0-9, `-`, `_` after IDNA")]
    InvalidCharacter,
}

/// Canonicalises a host as it appeared in a request target, a `Host` header or an SNI.
pub fn canonical_host(raw: &str) -> Result<Host, HostError> {
    if raw.is_empty() {
        return Err(HostError::Empty);
    }
    if raw.len() > MAX_RAW_LEN {
        return Err(HostError::TooLong);
    }
    if raw.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(HostError::ControlCharacter);
    }
    if let Some(inner) = raw.strip_prefix('[') {
        return bracketed_ipv6(inner);
    }
    if let Some(c) = raw
        .chars()
        .find(|c| matches!(c, '%' | '@' | '\\' | '/' | ':' | '[' | ']' | '?' | '#'))
    {
        return Err(HostError::ForbiddenCharacter(c));
    }
    let ascii = idna::domain_to_ascii(raw).map_err(|_| HostError::Idna)?;
    let name = ascii.strip_suffix('.').unwrap_or(&ascii);
    if name.is_empty() {
        return Err(HostError::Empty);
    }
    if ends_in_number(name) {
        return parse_ipv4(name).map(|ip| Host::Ip(IpAddr::V4(ip)));
    }
    validate_name(name)?;
    Ok(Host::Name(name.to_string()))
}

fn bracketed_ipv6(inner: &str) -> Result<Host, HostError> {
    let inner = inner.strip_suffix(']').ok_or(HostError::InvalidIpv6)?;
    if inner.contains('%') {
        return Err(HostError::ZoneId);
    }
    let ip: Ipv6Addr = inner.parse().map_err(|_| HostError::InvalidIpv6)?;
    Ok(Host::Ip(match ip.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(ip),
    }))
}

/// WHATWG "ends in a number": the last label is all digits, or `0x` followed by hex digits.
fn ends_in_number(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    last.strip_prefix("0x")
        .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The `inet_aton` forms: 1 to 4 parts, each decimal, octal (leading `0`) or hex (`0x`); the last
/// part fills the remaining bytes.
fn parse_ipv4(name: &str) -> Result<Ipv4Addr, HostError> {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 4 {
        return Err(HostError::InvalidIpv4);
    }
    let numbers = parts
        .iter()
        .map(|part| parse_ipv4_number(part))
        .collect::<Option<Vec<u64>>>()
        .ok_or(HostError::InvalidIpv4)?;
    let (last, leading) = numbers.split_last().ok_or(HostError::InvalidIpv4)?;
    if leading.iter().any(|&n| n > 255) {
        return Err(HostError::InvalidIpv4);
    }
    let last_bits = 8 * (5 - numbers.len() as u32);
    if *last >= 1u64 << last_bits {
        return Err(HostError::InvalidIpv4);
    }
    let mut value = *last;
    for (index, &n) in leading.iter().enumerate() {
        value += n << (8 * (3 - index as u32));
    }
    let value = u32::try_from(value).map_err(|_| HostError::InvalidIpv4)?;
    Ok(Ipv4Addr::from(value))
}

fn parse_ipv4_number(part: &str) -> Option<u64> {
    if part.is_empty() {
        return None;
    }
    let (digits, radix) = if let Some(hex) = part.strip_prefix("0x") {
        (hex, 16)
    } else if part.len() > 1 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    if digits.is_empty() {
        return Some(0);
    }
    // More digits than any valid part has: refuse before the number can overflow.
    if digits.len() > 12 || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

fn validate_name(name: &str) -> Result<(), HostError> {
    if name.len() > MAX_NAME_LEN {
        return Err(HostError::NameTooLong);
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(HostError::EmptyLabel);
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(HostError::LabelTooLong);
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(HostError::InvalidCharacter);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> Host {
        Host::Ip(s.parse().unwrap())
    }

    fn name(s: &str) -> Host {
        Host::Name(s.to_string())
    }

    #[test]
    fn names_are_lower_case_without_one_trailing_dot() {
        assert_eq!(canonical_host("PyPI.org.").unwrap(), name("pypi.org"));
        assert_eq!(canonical_host("pypi.org").unwrap(), name("pypi.org"));
        assert_eq!(
            canonical_host("under_score.example").unwrap(),
            name("under_score.example")
        );
        assert_eq!(canonical_host("localhost").unwrap(), name("localhost"));
        assert_eq!(
            canonical_host("pypi.org..").unwrap_err(),
            HostError::EmptyLabel
        );
        assert_eq!(
            canonical_host(".pypi.org").unwrap_err(),
            HostError::EmptyLabel
        );
        assert_eq!(canonical_host("a..b").unwrap_err(), HostError::EmptyLabel);
        assert_eq!(canonical_host(".").unwrap_err(), HostError::Empty);
        assert_eq!(canonical_host("").unwrap_err(), HostError::Empty);
    }

    #[test]
    fn idna_becomes_punycode() {
        assert_eq!(
            canonical_host("Bücher.example").unwrap(),
            name("xn--bcher-kva.example")
        );
        assert_eq!(
            canonical_host("xn--bcher-kva.example").unwrap(),
            name("xn--bcher-kva.example")
        );
        // Cyrillic "а" in a look-alike of example.com is a different (punycode) name.
        assert_eq!(
            canonical_host("exаmple.com").unwrap(),
            name("xn--exmple-4nf.com")
        );
        // Full-width letters and the ideographic full stop map to their ASCII forms.
        assert_eq!(
            canonical_host("ｅｘａｍｐｌｅ。com").unwrap(),
            name("example.com")
        );
        assert_eq!(
            canonical_host("emoji-💩.example").unwrap(),
            name("xn--emoji--nx54e.example")
        );
    }

    #[test]
    fn every_ipv4_spelling_is_dotted_quad() {
        for spelling in [
            "127.0.0.1",
            "2130706433",
            "0x7f000001",
            "0x7F.1",
            "0x7f.0.0.1",
            "0177.0.0.1",
            "0177.0.0.01",
            "127.1",
            "127.0.1",
            "127.0.0.1.",
            "017700000001",
            "１２７.０.０.１",
        ] {
            assert_eq!(
                canonical_host(spelling).unwrap(),
                ip("127.0.0.1"),
                "{spelling}"
            );
        }
        assert_eq!(
            canonical_host("169.254.169.254").unwrap(),
            ip("169.254.169.254")
        );
        assert_eq!(canonical_host("0xa9fea9fe").unwrap(), ip("169.254.169.254"));
        assert_eq!(canonical_host("0").unwrap(), ip("0.0.0.0"));
        assert_eq!(canonical_host("0x").unwrap(), ip("0.0.0.0"));
        assert_eq!(canonical_host("4294967295").unwrap(), ip("255.255.255.255"));
    }

    #[test]
    fn numbers_that_are_not_addresses_are_refused() {
        for spelling in [
            "256.0.0.1",
            "1.2.3.256",
            "4294967296",
            "1.2.3.4.5",
            "08.0.0.1",
            "0x1g.1",
            "example.123",
            "1.2.65536",
            "99999999999999999999",
            "1..1",
        ] {
            assert!(canonical_host(spelling).is_err(), "{spelling}");
        }
        // A name with digits that does not end in a number is a name.
        assert_eq!(canonical_host("123.example").unwrap(), name("123.example"));
        assert_eq!(canonical_host("1.2.3.4x").unwrap(), name("1.2.3.4x"));
    }

    #[test]
    fn ipv6_literals() {
        assert_eq!(canonical_host("[::1]").unwrap(), ip("::1"));
        assert_eq!(canonical_host("[0:0:0:0:0:0:0:1]").unwrap(), ip("::1"));
        assert_eq!(
            canonical_host("[::ffff:169.254.169.254]").unwrap(),
            ip("169.254.169.254")
        );
        assert_eq!(
            canonical_host("[::ffff:a9fe:a9fe]").unwrap(),
            ip("169.254.169.254")
        );
        assert_eq!(
            canonical_host("[64:ff9b::a9fe:a9fe]").unwrap(),
            ip("64:ff9b::a9fe:a9fe")
        );
        assert_eq!(
            canonical_host("[FD00:EC2::254]").unwrap(),
            ip("fd00:ec2::254")
        );
        assert_eq!(canonical_host("[::1").unwrap_err(), HostError::InvalidIpv6);
        assert_eq!(
            canonical_host("[example.com]").unwrap_err(),
            HostError::InvalidIpv6
        );
        assert_eq!(
            canonical_host("::1").unwrap_err(),
            HostError::ForbiddenCharacter(':')
        );
        assert_eq!(ip("::1").authority(443, 80), "[::1]:443");
        assert_eq!(name("a.example").authority(80, 80), "a.example");
    }

    #[test]
    fn zone_ids_control_characters_and_separators_are_refused() {
        assert_eq!(
            canonical_host("[fe80::1%25eth0]").unwrap_err(),
            HostError::ZoneId
        );
        assert_eq!(
            canonical_host("[fe80::1%eth0]").unwrap_err(),
            HostError::ZoneId
        );
        for raw in [
            "a\nb",
            "a\rb.example",
            "a\0.example",
            "a b",
            "a\u{7f}b",
            "a\tb",
            "\u{85}x",
        ] {
            assert_eq!(
                canonical_host(raw).unwrap_err(),
                HostError::ControlCharacter,
                "{raw:?}"
            );
        }
        for raw in [
            "evil.com:443.allowed.com",
            "user@allowed.com",
            "a/b",
            "a\\b",
            "%31.0.0.1",
        ] {
            assert!(
                matches!(canonical_host(raw), Err(HostError::ForbiddenCharacter(_))),
                "{raw:?}"
            );
        }
        assert_eq!(
            canonical_host("a*.example").unwrap_err(),
            HostError::InvalidCharacter
        );
        assert_eq!(
            canonical_host(&"a".repeat(2000)).unwrap_err(),
            HostError::TooLong
        );
        assert_eq!(
            canonical_host(&format!("{}.example", "a".repeat(64))).unwrap_err(),
            HostError::LabelTooLong
        );
        assert_eq!(
            canonical_host(&["abcdefghi"; 26].join(".")).unwrap_err(),
            HostError::NameTooLong
        );
    }

    proptest! {
        /// Canonicalising is idempotent: the canonical form canonicalises to itself.
        #[test]
        fn idempotent(raw in "\\PC{0,40}") {
            if let Ok(host) = canonical_host(&raw) {
                let again = match &host {
                    Host::Ip(IpAddr::V6(v6)) => canonical_host(&format!("[{v6}]")),
                    other => canonical_host(&other.to_string()),
                };
                prop_assert_eq!(again, Ok(host));
            }
        }

        /// Whatever comes out is safe to put on the wire and compare as a string.
        #[test]
        fn output_is_plain_ascii(raw in "[a-zA-Z0-9.\\-_]{0,30}|\\PC{0,20}") {
            if let Ok(Host::Name(name)) = canonical_host(&raw) {
                prop_assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()
                    || b == b'-' || b == b'_' || b == b'.'));
                prop_assert!(!name.ends_with('.') && !name.starts_with('.'));
                prop_assert!(!ends_in_number(&name));
            }
        }

        /// Every 32-bit address, in every inet_aton spelling, is the same address.
        #[test]
        fn ipv4_spellings_agree(value: u32, form in 0usize..5) {
            let [a, b, c, d] = value.to_be_bytes();
            let spelled = match form {
                0 => format!("{value}"),
                1 => format!("0x{value:x}"),
                2 => format!("0{a:o}.0{b:o}.0{c:o}.0{d:o}"),
                3 => format!("{a}.{}", u32::from_be_bytes([0, b, c, d])),
                _ => format!("0x{a:X}.{b}.0x{:x}.", u16::from_be_bytes([c, d])),
            };
            prop_assert_eq!(canonical_host(&spelled), Ok(Host::Ip(IpAddr::V4(Ipv4Addr::from(value)))));
        }

        /// No control character survives, wherever it is put.
        #[test]
        fn control_characters_never_pass(prefix in "[a-z]{0,8}", c in proptest::char::range('\0', '\u{1f}'), suffix in "[a-z.]{0,8}") {
            let raw = format!("{prefix}{c}{suffix}");
            prop_assert!(canonical_host(&raw).is_err());
        }
    }
}
