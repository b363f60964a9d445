//! Fuzzing of the parsers that face the sandbox: the request head (`head`), the ClientHello
//! (`tls`), host canonicalisation (`host`), and on the inspected request path: path
//! normalisation (`path`, against the `url` crate's resolver and a decode-everything server)
//! and placeholder scanning (`credentials`). Property-based (proptest), run by `cargo test`
//! with proptest's default number of cases, and for as long as wanted by `make fuzz`
//! (`PROPTEST_CASES=...`, release build).
//!
//! Inputs are arbitrary bytes and mutations (bit flips, insertions, deletions, truncations,
//! duplications) of the seed corpus in `egress-proxy/fuzz/corpus/` (real heads; real
//! ClientHellos made by Python's `ssl`). A failure proptest finds is shrunk and saved under
//! `proptest-regressions/` and replayed first on every later run: commit those files.

use std::path::Path;

use proptest::prelude::*;

use crate::credentials::{Credential, ExecutionCredentials, Secret};
use crate::head::{check_connect, parse_head, parse_target, plain_request, Target};
use crate::host::{canonical_host, Host};
use crate::path::normalise;
use crate::tls::{parse_client_hello, record_len};

/// Every file of one corpus directory, sorted by name.
fn corpus(name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(name);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("corpus {}: {err}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "corpus {} is empty", dir.display());
    files
}

/// One way to damage an input; positions wrap around its length.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
    Duplicate(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip(at, bit)),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert(at, byte)),
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 1usize..64).prop_map(|(at, len)| Mutation::Duplicate(at, len)),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for mutation in mutations {
        let len = bytes.len().max(1);
        match *mutation {
            Mutation::Flip(at, bit) if !bytes.is_empty() => bytes[at % len] ^= 1 << bit,
            Mutation::Insert(at, byte) => bytes.insert(at % (bytes.len() + 1), byte),
            Mutation::Delete(at) if !bytes.is_empty() => {
                bytes.remove(at % len);
            }
            Mutation::Truncate(at) => bytes.truncate(at % (bytes.len() + 1)),
            Mutation::Duplicate(at, span) if !bytes.is_empty() => {
                let start = at % len;
                let end = (start + span).min(bytes.len());
                let copy = bytes[start..end].to_vec();
                bytes.splice(start..start, copy);
            }
            _ => {}
        }
    }
    bytes
}

/// A seed of `corpus` (by index) damaged by up to eight mutations.
fn mutated(corpus_name: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = corpus(corpus_name);
    let count = seeds.len();
    (0..count, proptest::collection::vec(mutation(), 0..8))
        .prop_map(move |(index, mutations)| mutate(seeds[index].1.clone(), &mutations))
}

/// The whole path a head takes in the proxy; checks what it promises about what goes upstream.
fn head_pipeline(buf: &[u8]) -> Result<(), TestCaseError> {
    let max = 8 * 1024;
    let Ok(Some(head)) = parse_head(buf, max) else {
        return Ok(());
    };
    prop_assert!(head.len <= buf.len() && head.len <= max);
    let Ok(target) = parse_target(&head.method, &head.target) else {
        return Ok(());
    };
    match target {
        Target::Connect { host, .. } => {
            let _ = canonical_host(&host);
            let _ = check_connect(&head);
        }
        Target::Http { host, port, path } => {
            let Ok(host) = canonical_host(&host) else {
                return Ok(());
            };
            let Ok(forward) = plain_request(&head, &host, port, &path) else {
                return Ok(());
            };
            check_forwarded(&forward.head, &head.method)?;
        }
    }
    Ok(())
}

/// What goes upstream parses again as one head, with one Host, no `Proxy-*` field, and never
/// both Content-Length and Transfer-Encoding.
fn check_forwarded(bytes: &[u8], method: &str) -> Result<(), TestCaseError> {
    let again = parse_head(bytes, usize::MAX);
    let again = match again {
        Ok(Some(again)) => again,
        other => return Err(TestCaseError::fail(format!("forwarded head: {other:?}"))),
    };
    prop_assert_eq!(again.len, bytes.len(), "nothing after the forwarded head");
    prop_assert_eq!(&again.method, method);
    let names: Vec<String> = again
        .headers
        .iter()
        .map(|(name, _)| name.to_ascii_lowercase())
        .collect();
    prop_assert_eq!(names.iter().filter(|n| *n == "host").count(), 1);
    prop_assert!(!names.iter().any(|n| n.starts_with("proxy-")), "{names:?}");
    let length = names.iter().any(|n| n == "content-length");
    let chunked = names.iter().any(|n| n == "transfer-encoding");
    prop_assert!(!(length && chunked), "{names:?}");
    Ok(())
}

/// What the ClientHello parser promises whatever it is given.
fn hello_checks(buf: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(Some(len)) = record_len(buf) {
        prop_assert!(len <= 5 + 16384, "record of {len} bytes");
    }
    if let Ok(hello) = parse_client_hello(buf) {
        if let Some(name) = &hello.sni {
            prop_assert!(!name.is_empty() && name.len() <= 255, "{name:?}");
            prop_assert!(!name.chars().any(char::is_control), "{name:?}");
        }
    }
    Ok(())
}

#[test]
fn the_seeds_parse_as_what_they_are() {
    for (name, bytes) in corpus("client_hello") {
        let hello = parse_client_hello(&bytes).unwrap_or_else(|err| panic!("{name}: {err}"));
        let expected = name
            .trim_end_matches(".bin")
            .rsplit_once('-')
            .map(|(_, host)| host.to_owned())
            .filter(|host| host.contains('.'));
        assert_eq!(hello.sni, expected, "{name}");
        // Every strict prefix is incomplete or refused, never accepted.
        for cut in 0..bytes.len() {
            assert!(
                parse_client_hello(&bytes[..cut]).is_err(),
                "{name} cut at {cut}"
            );
        }
    }
    for (name, bytes) in corpus("head") {
        let head = parse_head(&bytes, 8192)
            .unwrap()
            .unwrap_or_else(|| panic!("{name}"));
        assert!(parse_target(&head.method, &head.target).is_ok(), "{name}");
    }
}

/// Hosts whose spellings stress canonicalisation; mutated below.
const HOSTS: &[&str] = &[
    "pypi.org",
    "PyPI.org.",
    "files.pythonhosted.org",
    "xn--bcher-kva.example",
    "bücher.example",
    "ｅｘａｍｐｌｅ.com",
    "2130706433",
    "0x7f.1",
    "127.1",
    "0177.0.0.01",
    "[::ffff:127.0.0.1]",
    "[64:ff9b::a9fe:a9fe]",
    "[fe80::1%25eth0]",
    "169.254.169.254",
    "a_b.example",
    "1.2.3.4.nip.io",
];

proptest! {
    #[test]
    fn heads_from_arbitrary_bytes(buf in proptest::collection::vec(any::<u8>(), 0..600)) {
        head_pipeline(&buf)?;
    }

    #[test]
    fn heads_from_mutated_seeds(buf in mutated("head")) {
        head_pipeline(&buf)?;
        // Read in two pieces, the answer never runs past what has arrived.
        let cut = buf.len() / 2;
        if let Ok(Some(head)) = parse_head(&buf[..cut], 8192) {
            prop_assert!(head.len <= cut);
        }
    }

    #[test]
    fn client_hellos_from_arbitrary_bytes(buf in proptest::collection::vec(any::<u8>(), 0..600)) {
        hello_checks(&buf)?;
    }

    #[test]
    fn client_hellos_from_mutated_seeds(buf in mutated("client_hello")) {
        hello_checks(&buf)?;
    }

    #[test]
    fn hosts_from_mutated_spellings(index in 0..HOSTS.len(),
                                    mutations in proptest::collection::vec(mutation(), 0..4)) {
        let bytes = mutate(HOSTS[index].as_bytes().to_vec(), &mutations);
        let raw = String::from_utf8_lossy(&bytes);
        if let Ok(host) = canonical_host(&raw) {
            let again = match &host {
                Host::Ip(std::net::IpAddr::V6(v6)) => canonical_host(&format!("[{v6}]")),
                other => canonical_host(&other.to_string()),
            };
            prop_assert_eq!(again, Ok(host.clone()), "from {:?}", raw);
            if let Host::Name(name) = &host {
                // A name never slips past the address checks as an address.
                prop_assert!(name.parse::<std::net::IpAddr>().is_err(), "{name}");
                prop_assert!(name.len() <= 253 && !name.ends_with('.'), "{name}");
            }
        }
    }

    #[test]
    fn spellings_of_one_name_are_one_name(labels in proptest::collection::vec("[a-z][a-z0-9]{0,9}", 2..4),
                                          upper in any::<bool>(), dot in any::<bool>(), wide in any::<bool>()) {
        let name = labels.join(".");
        let mut spelled: String = if wide {
            // Fullwidth forms map to ASCII under IDNA (UTS 46).
            name.chars().map(|c| if c == '.' { c } else { char::from_u32(c as u32 + 0xFEE0).unwrap_or(c) }).collect()
        } else {
            name.clone()
        };
        if upper {
            spelled = spelled.to_uppercase();
        }
        if dot {
            spelled.push('.');
        }
        prop_assert_eq!(canonical_host(&spelled), Ok(Host::Name(name)));
    }
}

/// Pieces of paths that servers read in more than one way.
const PATH_PIECES: &[&str] = &[
    "%25%32%65",
    "%32",
    "%65",
    "/",
    "/",
    "/",
    "a",
    "repos",
    "admin",
    ".",
    "..",
    "%2e",
    "%2E",
    "%2e%2e",
    ".%2e",
    "%2e.",
    "%2f",
    "%2F",
    "%5c",
    "\\",
    "%00",
    "%25",
    "%252e",
    "%25zz",
    ";",
    "..;",
    ";x",
    "%3b",
    "%3B",
    "%41",
    "%7e",
    "~",
    "%",
    "%z",
    "%c3%a9",
    "//",
    "?",
    "#",
    " ",
    "%20",
    "%0a",
    "\u{e9}",
];

fn path_from(pieces: &[usize]) -> String {
    let mut path = String::from("/");
    for &piece in pieces {
        path.push_str(PATH_PIECES[piece % PATH_PIECES.len()]);
    }
    path
}

/// Decodes every `%XX` (what a server that decodes the whole path does).
fn decode_all(path: &str) -> Vec<u8> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        });
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
    out
}

/// What the normaliser promises of an accepted path.
fn path_checks(raw: &str) -> Result<(), TestCaseError> {
    let Ok(normal) = normalise(raw) else {
        return Ok(());
    };
    // A fixed point: deciding again decides the same.
    prop_assert_eq!(normalise(&normal), Ok(normal.clone()), "from {:?}", raw);
    // The reference resolver (the `url` crate, WHATWG) resolves what is forwarded to itself...
    let forwarded = url::Url::parse(&format!("https://h.example{normal}"));
    let forwarded = forwarded.map_err(|err| TestCaseError::fail(format!("{normal:?}: {err}")))?;
    prop_assert_eq!(forwarded.path(), normal.as_str(), "from {:?}", raw);
    // ...and what the sandbox sent to the same place the policy saw, once unreserved escapes
    // are decoded (which the reference leaves as they are).
    if let Ok(reference) = url::Url::parse(&format!("https://h.example{raw}")) {
        // (`?` and `#` never reach the normaliser: the query was split off before.)
        if !raw.contains(['?', '#']) {
            prop_assert_eq!(
                normalise(reference.path()),
                Ok(normal.clone()),
                "from {:?}",
                raw
            );
        }
    }
    // A server that decodes everything finds no separator, no dot segment, no NUL or control
    // character it could walk with.
    // Nor does one that decodes twice.
    let once = decode_all(&normal);
    let twice = decode_all(&String::from_utf8_lossy(&once));
    for decoded in [once, twice] {
        prop_assert!(
            !decoded.contains(&b'\\') && !decoded.contains(&0),
            "{:?}",
            normal
        );
        prop_assert!(
            !decoded.iter().any(|b| *b < 0x20 || *b == 0x7f),
            "{:?}",
            normal
        );
        for segment in decoded.split(|b| *b == b'/') {
            let name = segment.split(|b| *b == b';').next().unwrap_or(segment);
            prop_assert!(name != b"." && name != b"..", "{:?} from {:?}", normal, raw);
        }
    }
    Ok(())
}

fn credential(name: &str, header: &str) -> Credential {
    Credential {
        name: name.to_owned(),
        header: header.to_owned(),
        format: "Bearer {value}".to_owned(),
        value: Secret::new(format!("value-of-{name}")),
    }
}

proptest! {
    #[test]
    fn paths_from_pieces(pieces in proptest::collection::vec(any::<usize>(), 0..12)) {
        path_checks(&path_from(&pieces))?;
    }

    #[test]
    fn paths_from_arbitrary_text(raw in "/[ -~]{0,40}") {
        path_checks(&raw)?;
    }

    #[test]
    fn paths_from_mutated_pieces(pieces in proptest::collection::vec(any::<usize>(), 0..8),
                                 mutations in proptest::collection::vec(mutation(), 0..4)) {
        let bytes = mutate(path_from(&pieces).into_bytes(), &mutations);
        if let Ok(raw) = String::from_utf8(bytes) {
            path_checks(&raw)?;
        }
    }

    /// A placeholder anywhere in a request's head is found, and allowed only in its own
    /// credential's header on a request granted it; split or not, case or not.
    #[test]
    fn placeholders_are_found_wherever_they_are(
        prefix in "[ -~]{0,20}", suffix in "[ -~]{0,20}", place in 0usize..4,
        granted in any::<bool>(), which in 0usize..2,
    ) {
        let credentials = ExecutionCredentials::new(vec![
            credential("one", "authorization"),
            credential("two", "x-api-key"),
        ]);
        let env = credentials.env();
        let (name, placeholder) = (["one", "two"][which], env[which].1.clone());
        let text = format!("{prefix}{placeholder}{suffix}");
        let own_header = ["authorization", "x-api-key"][which];
        let other_header = ["x-api-key", "authorization"][which];
        let (target, header) = match place {
            0 => (format!("/p/{text}"), None),
            1 => (format!("/p?q={text}"), None),
            2 => ("/p".to_owned(), Some((own_header, text.clone()))),
            _ => ("/p".to_owned(), Some((other_header, text.clone()))),
        };
        let grants: Vec<String> = if granted { vec![name.to_owned()] } else { Vec::new() };
        let headers: Vec<(&str, &[u8])> = header
            .iter()
            .map(|(n, v)| (*n, v.as_bytes()))
            .collect();
        let found = credentials.misdirected(target.as_bytes(), headers, &grants);
        let allowed = place == 2 && granted;
        prop_assert_eq!(found.is_empty(), allowed, "{} {:?} granted={}", target, header, granted);
        if !allowed {
            prop_assert!(found.contains(name));
        }
    }
}
