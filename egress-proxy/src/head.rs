//! The request head a sandbox sends to the proxy: parsing it (bounded), reading its target, and
//! the header rules of a plain HTTP request.
//!
//! Two forms are served: `CONNECT host:port` (authority-form) and absolute-form plain HTTP
//! (`GET http://host[:port]/path`). Origin-form requests, `https://` in absolute form, HTTP/2 and
//! anything httparse refuses are bad requests. For plain HTTP the head is rebuilt rather than
//! edited: the request line in origin-form, a `Host` equal to the target, the client's end-to-end
//! headers, and `Connection: close`; hop-by-hop headers, every `Proxy-*` and `X-Sandgate-*` header
//! and the headers the client's `Connection` names are dropped. Requests whose body framing could
//! be read two ways (Content-Length with Transfer-Encoding, repeated or non-numeric lengths, codings
//! other than `chunked`, framing headers named in `Connection` or spelled with `_`) are refused.

use crate::host::{canonical_host, Host, HostError};

/// Most header fields a request head may carry.
const MAX_HEADERS: usize = 100;
/// Default port of `http://`.
pub const HTTP_PORT: u16 = 80;

/// A parsed request head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub method: String,
    /// The request-target as sent.
    pub target: String,
    /// Minor version of HTTP/1.x.
    pub minor_version: u8,
    pub headers: Vec<(String, Vec<u8>)>,
    /// Length of the head in the buffer it was parsed from; what follows is body or tunnel data.
    pub len: usize,
}

/// What a request head asks to reach (host as sent: not yet canonical).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Connect {
        host: String,
        port: u16,
    },
    Http {
        host: String,
        port: u16,
        path: String,
    },
}

/// How the body of a plain HTTP request ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// A plain HTTP request ready to go upstream.
#[derive(Debug, Clone)]
pub struct Forward {
    pub head: Vec<u8>,
    pub body: BodyFraming,
}

/// Why a request head was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    #[error("request head is larger than {0} bytes")]
    TooLarge(usize),
    #[error("malformed request: {0}")]
    Malformed(String),
    #[error("unsupported request: {0}")]
    Unsupported(&'static str),
    #[error("ambiguous request framing: {0}")]
    Smuggling(&'static str),
    #[error("Host header {0}")]
    HostMismatch(&'static str),
    #[error("invalid host: {0}")]
    Host(#[from] HostError),
}

/// Parses the head at the start of `buf`; `Ok(None)` while it is incomplete and under `max`.
pub fn parse_head(buf: &[u8], max: usize) -> Result<Option<RequestHead>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let len = match request.parse(buf) {
        Ok(httparse::Status::Complete(len)) if len <= max => len,
        Ok(httparse::Status::Complete(_)) => return Err(HeadError::TooLarge(max)),
        Ok(httparse::Status::Partial) if buf.len() >= max => return Err(HeadError::TooLarge(max)),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(HeadError::Malformed(format!(
                "more than {MAX_HEADERS} header fields"
            )))
        }
        Err(err) => return Err(HeadError::Malformed(err.to_string())),
    };
    let (Some(method), Some(target), Some(minor_version)) =
        (request.method, request.path, request.version)
    else {
        return Err(HeadError::Malformed("incomplete request line".into()));
    };
    Ok(Some(RequestHead {
        method: method.to_string(),
        target: target.to_string(),
        minor_version,
        headers: request
            .headers
            .iter()
            .map(|h| (h.name.to_string(), h.value.to_vec()))
            .collect(),
        len,
    }))
}

/// Reads the target of a head: authority-form for `CONNECT`, absolute-form `http://` otherwise.
pub fn parse_target(method: &str, target: &str) -> Result<Target, HeadError> {
    if method == "CONNECT" {
        let (host, port) = split_host_port(target)?;
        let port = port.ok_or_else(|| HeadError::Malformed("CONNECT target has no port".into()))?;
        return Ok(Target::Connect { host, port });
    }
    if target.starts_with('/') || target == "*" {
        return Err(HeadError::Unsupported(
            "origin-form request: this is a forward proxy, send an absolute URL",
        ));
    }
    let Some((scheme, rest)) = target.split_once("://") else {
        return Err(HeadError::Malformed(
            "request target is not an absolute URL".into(),
        ));
    };
    if scheme.eq_ignore_ascii_case("https") {
        return Err(HeadError::Unsupported(
            "https:// in absolute form: use CONNECT",
        ));
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(HeadError::Unsupported(
            "only http:// URLs and CONNECT are proxied",
        ));
    }
    if target.contains('#') {
        return Err(HeadError::Malformed("request target has a fragment".into()));
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.contains('@') {
        return Err(HeadError::Malformed("request target has user info".into()));
    }
    let (host, port) = split_host_port(authority)?;
    let path = match path.chars().next() {
        None => "/".to_string(),
        Some('?') => format!("/{path}"),
        Some(_) => path.to_string(),
    };
    Ok(Target::Http {
        host,
        port: port.unwrap_or(HTTP_PORT),
        path,
    })
}

/// Splits `host[:port]` (IPv6 in brackets); the host is returned as sent.
fn split_host_port(authority: &str) -> Result<(String, Option<u16>), HeadError> {
    let (host, port) = if authority.starts_with('[') {
        let close = authority
            .find(']')
            .ok_or_else(|| HeadError::Malformed("unclosed `[` in host".into()))?;
        let (host, rest) = authority.split_at(close + 1);
        match rest {
            "" => (host, None),
            _ => match rest.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(HeadError::Malformed("bytes after `]` in host".into())),
            },
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = port.map(parse_port).transpose()?;
    if host.is_empty() {
        return Err(HeadError::Malformed("empty host".into()));
    }
    if !host.starts_with('[') && host.contains(':') {
        return Err(HeadError::Malformed("IPv6 host without brackets".into()));
    }
    Ok((host.to_string(), port))
}

/// A port: 1-65535 in plain decimal, no sign, no leading zero.
fn parse_port(port: &str) -> Result<u16, HeadError> {
    let bad = || HeadError::Malformed(format!("invalid port {:?}", truncate(port, 16)));
    if port.is_empty() || port.len() > 5 || port.starts_with('0') {
        return Err(bad());
    }
    if !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    port.parse::<u16>().map_err(|_| bad())
}

fn truncate(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// Checks the headers of a CONNECT: it carries no body.
pub fn check_connect(head: &RequestHead) -> Result<(), HeadError> {
    for (name, value) in &head.headers {
        let name = name.to_ascii_lowercase().replace('_', "-");
        let empty_length = name == "content-length" && value.as_slice() == b"0";
        if (name == "content-length" && !empty_length) || name == "transfer-encoding" {
            return Err(HeadError::Malformed("CONNECT with a body".into()));
        }
    }
    Ok(())
}

/// Builds the head to send upstream for a plain HTTP request to `host:port`.
pub fn plain_request(
    head: &RequestHead,
    host: &Host,
    port: u16,
    path: &str,
) -> Result<Forward, HeadError> {
    let named = connection_tokens(head)?;
    check_host_header(head, host, port)?;
    let body = body_framing(head)?;
    let mut out = Vec::with_capacity(head.len + 64);
    out.extend_from_slice(head.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(format!(" HTTP/1.{}\r\n", head.minor_version).as_bytes());
    out.extend_from_slice(format!("Host: {}\r\n", host.authority(port, HTTP_PORT)).as_bytes());
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        if is_dropped(&lower) || named.contains(&lower) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Forward { head: out, body })
}

/// Hop-by-hop headers, the proxy's own, and identity claims: never forwarded.
fn is_dropped(lower: &str) -> bool {
    let folded = lower.replace('_', "-");
    matches!(
        folded.as_str(),
        "connection" | "keep-alive" | "te" | "trailer" | "upgrade" | "host" | "http2-settings"
    ) || folded.starts_with("proxy-")
        || folded.starts_with("x-sandgate-")
}

/// The header names listed in `Connection`, lower case; framing headers may not be listed.
fn connection_tokens(head: &RequestHead) -> Result<Vec<String>, HeadError> {
    let mut tokens = Vec::new();
    for (name, value) in &head.headers {
        if !name.eq_ignore_ascii_case("connection") {
            continue;
        }
        let value = std::str::from_utf8(value)
            .map_err(|_| HeadError::Malformed("Connection header is not ASCII".into()))?;
        for token in value.split(',').map(|t| t.trim().to_ascii_lowercase()) {
            if matches!(
                token.replace('_', "-").as_str(),
                "content-length" | "transfer-encoding" | "host"
            ) {
                return Err(HeadError::Smuggling("Connection names a framing header"));
            }
            if !token.is_empty() {
                tokens.push(token);
            }
        }
    }
    Ok(tokens)
}

/// The Host header must name the request target (after canonicalisation, default port 80).
fn check_host_header(head: &RequestHead, host: &Host, port: u16) -> Result<(), HeadError> {
    let values: Vec<&[u8]> = head
        .headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("host"))
        .map(|(_, value)| value.as_slice())
        .collect();
    let value = match values.as_slice() {
        [] if head.minor_version == 0 => return Ok(()),
        [] => return Err(HeadError::HostMismatch("is missing")),
        [value] => *value,
        _ => return Err(HeadError::HostMismatch("is repeated")),
    };
    let value = std::str::from_utf8(value).map_err(|_| HeadError::HostMismatch("is not UTF-8"))?;
    let (claimed, claimed_port) =
        split_host_port(value.trim()).map_err(|_| HeadError::HostMismatch("is malformed"))?;
    let claimed = canonical_host(&claimed).map_err(|_| HeadError::HostMismatch("is invalid"))?;
    if claimed != *host || claimed_port.unwrap_or(HTTP_PORT) != port {
        return Err(HeadError::HostMismatch("differs from the request target"));
    }
    Ok(())
}

/// How the request body ends; refuses every framing two parsers could read differently.
fn body_framing(head: &RequestHead) -> Result<BodyFraming, HeadError> {
    let mut length = None;
    let mut chunked = false;
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        let folded = lower.replace('_', "-");
        let framing = matches!(folded.as_str(), "content-length" | "transfer-encoding");
        if framing && lower != folded {
            return Err(HeadError::Smuggling("framing header spelled with `_`"));
        }
        match lower.as_str() {
            "content-length" => {
                if length.is_some() {
                    return Err(HeadError::Smuggling("Content-Length is repeated"));
                }
                length = Some(parse_length(value)?);
            }
            "transfer-encoding" => {
                if chunked {
                    return Err(HeadError::Smuggling("Transfer-Encoding is repeated"));
                }
                if !value.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                    return Err(HeadError::Smuggling(
                        "Transfer-Encoding other than `chunked`",
                    ));
                }
                if head.minor_version == 0 {
                    return Err(HeadError::Smuggling("Transfer-Encoding in HTTP/1.0"));
                }
                chunked = true;
            }
            _ => {}
        }
    }
    match (length, chunked) {
        (Some(_), true) => Err(HeadError::Smuggling(
            "both Content-Length and Transfer-Encoding",
        )),
        (Some(0), false) | (None, false) => Ok(BodyFraming::None),
        (Some(n), false) => Ok(BodyFraming::Length(n)),
        (None, true) => Ok(BodyFraming::Chunked),
    }
}

fn parse_length(value: &[u8]) -> Result<u64, HeadError> {
    let value = value.trim_ascii();
    if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
        return Err(HeadError::Smuggling("Content-Length is not a plain number"));
    }
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or(HeadError::Smuggling("Content-Length is not a plain number"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: usize = 16 * 1024;

    fn head(raw: &str) -> RequestHead {
        parse_head(raw.as_bytes(), MAX).unwrap().unwrap()
    }

    fn forward(raw: &str) -> Result<Forward, HeadError> {
        let head = head(raw);
        let Target::Http { host, port, path } = parse_target(&head.method, &head.target)? else {
            panic!("not plain HTTP");
        };
        plain_request(&head, &canonical_host(&host)?, port, &path)
    }

    fn forwarded(raw: &str) -> String {
        String::from_utf8(forward(raw).unwrap().head).unwrap()
    }

    #[test]
    fn heads_are_bounded_and_incremental() {
        assert!(
            parse_head(b"GET http://a.example/ HTTP/1.1\r\nHost: a", MAX)
                .unwrap()
                .is_none()
        );
        let big = format!(
            "GET http://a.example/ HTTP/1.1\r\nX: {}\r\n",
            "a".repeat(MAX)
        );
        assert_eq!(
            parse_head(big.as_bytes(), MAX).unwrap_err(),
            HeadError::TooLarge(MAX)
        );
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X{i}: v\r\n")).collect();
        let many = format!("GET http://a.example/ HTTP/1.1\r\n{many}\r\n");
        assert!(matches!(
            parse_head(many.as_bytes(), MAX),
            Err(HeadError::Malformed(_))
        ));
        assert!(matches!(
            parse_head(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", MAX),
            Err(HeadError::Malformed(_))
        ));
        assert!(matches!(
            parse_head(b"\x16\x03\x01\x00\x05hello", MAX),
            Err(HeadError::Malformed(_))
        ));
        let raw = b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n\x16\x03\x01";
        let parsed = parse_head(raw, MAX).unwrap().unwrap();
        assert_eq!(&raw[parsed.len..], b"\x16\x03\x01");
    }

    #[test]
    fn targets() {
        let connect = |t: &str| parse_target("CONNECT", t);
        let get = |t: &str| parse_target("GET", t);
        assert_eq!(
            connect("pypi.org:443").unwrap(),
            Target::Connect {
                host: "pypi.org".into(),
                port: 443
            }
        );
        assert_eq!(
            connect("[::1]:443").unwrap(),
            Target::Connect {
                host: "[::1]".into(),
                port: 443
            }
        );
        for bad in [
            "pypi.org",
            "pypi.org:",
            "pypi.org:0",
            "pypi.org:65536",
            "pypi.org:0443",
            "pypi.org:+443",
            "::1:443",
            "[::1]443",
            ":443",
            "a:b:443",
        ] {
            assert!(connect(bad).is_err(), "{bad}");
        }
        assert_eq!(
            get("http://A.example:8080/x?y=1").unwrap(),
            Target::Http {
                host: "A.example".into(),
                port: 8080,
                path: "/x?y=1".into()
            }
        );
        assert_eq!(
            get("HTTP://a.example").unwrap(),
            Target::Http {
                host: "a.example".into(),
                port: 80,
                path: "/".into()
            }
        );
        assert_eq!(
            get("http://a.example?q").unwrap(),
            Target::Http {
                host: "a.example".into(),
                port: 80,
                path: "/?q".into()
            }
        );
        assert!(matches!(get("/index.html"), Err(HeadError::Unsupported(_))));
        assert!(matches!(
            get("https://a.example/"),
            Err(HeadError::Unsupported(_))
        ));
        assert!(matches!(
            get("ftp://a.example/"),
            Err(HeadError::Unsupported(_))
        ));
        assert!(get("http://user:pw@a.example/").is_err());
        assert!(get("http://a.example/#frag").is_err());
        assert!(get("http:///x").is_err());
    }

    #[test]
    fn plain_requests_are_rebuilt() {
        let out = forwarded(
            "GET http://A.Example/p?q=1 HTTP/1.1\r\nHost: a.example.\r\nUser-Agent: t\r\n\
             Proxy-Authorization: Basic c2VjcmV0\r\nProxy_Authorization: x\r\n\
             X-Sandgate-Execution: ex_other\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\n\
             Keep-Alive: 5\r\nUpgrade: h2c\r\nTE: trailers\r\nAccept: */*\r\n\r\n",
        );
        assert_eq!(
            out,
            "GET /p?q=1 HTTP/1.1\r\nHost: a.example\r\nUser-Agent: t\r\nAccept: */*\r\n\
             Connection: close\r\n\r\n"
        );
        let out = forwarded("POST http://[2001:db8::1]:8080/ HTTP/1.1\r\nHost: [2001:db8::1]:8080\r\nContent-Length: 3\r\n\r\n");
        assert!(
            out.starts_with("POST / HTTP/1.1\r\nHost: [2001:db8::1]:8080\r\nContent-Length: 3\r\n"),
            "{out}"
        );
        // HTTP/1.0 without a Host header gets one.
        let out = forwarded("GET http://0x7f.1:81/ HTTP/1.0\r\n\r\n");
        assert!(
            out.starts_with("GET / HTTP/1.0\r\nHost: 127.0.0.1:81\r\n"),
            "{out}"
        );
    }

    #[test]
    fn host_header_must_name_the_target() {
        for (raw, why) in [
            (
                "GET http://a.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n",
                "differs",
            ),
            (
                "GET http://a.example/ HTTP/1.1\r\nHost: a.example:8080\r\n\r\n",
                "differs",
            ),
            (
                "GET http://a.example:8080/ HTTP/1.1\r\nHost: a.example\r\n\r\n",
                "differs",
            ),
            ("GET http://a.example/ HTTP/1.1\r\n\r\n", "missing"),
            (
                "GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nHost: a.example\r\n\r\n",
                "repeated",
            ),
            (
                "GET http://10.0.0.1/ HTTP/1.1\r\nHost: 10.0.0.2\r\n\r\n",
                "differs",
            ),
            (
                "GET http://a.example/ HTTP/1.1\r\nHost: a.example\0\r\n\r\n",
                "",
            ),
        ] {
            let err = match parse_head(raw.as_bytes(), MAX) {
                Ok(_) => forward(raw).unwrap_err(),
                Err(err) => err,
            };
            assert!(err.to_string().contains(why), "{raw:?}: {err}");
        }
        // Equal after canonicalisation is equal.
        forwarded("GET http://127.0.0.1/ HTTP/1.1\r\nHost: 2130706433:80\r\n\r\n");
        forwarded(
            "GET http://b\u{fc}cher.example/ HTTP/1.1\r\nHost: xn--bcher-kva.example\r\n\r\n",
        );
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        for raw in [
            "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 1, 2\r\n\r\n",
            "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: +3\r\n\r\n",
            "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 0x3\r\n\r\n",
            "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
            "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: gzip\r\n\r\n",
            "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST http://a.example/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent_Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 3\r\nConnection: content-length\r\n\r\n",
            "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nConnection: Transfer-Encoding\r\n\r\n",
        ] {
            assert!(matches!(forward(raw), Err(HeadError::Smuggling(_))), "{raw:?}");
        }
        // Whitespace before the colon never parses.
        assert!(parse_head(b"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding : chunked\r\n\r\n", MAX).is_err());
        let ok = |raw: &str| forward(raw).unwrap().body;
        assert_eq!(
            ok("POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 12\r\n\r\n"),
            BodyFraming::Length(12)
        );
        assert_eq!(ok("POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: Chunked\r\n\r\n"), BodyFraming::Chunked);
        assert_eq!(
            ok("GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n"),
            BodyFraming::None
        );
    }

    #[test]
    fn connect_has_no_body() {
        assert!(check_connect(&head(
            "CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n"
        ))
        .is_ok());
        assert!(check_connect(&head(
            "CONNECT a.example:443 HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
        ))
        .is_ok());
        assert!(check_connect(&head(
            "CONNECT a.example:443 HTTP/1.1\r\nContent-Length: 5\r\n\r\n"
        ))
        .is_err());
        assert!(check_connect(&head(
            "CONNECT a.example:443 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        ))
        .is_err());
    }

    proptest! {
        /// Any bytes: parsing never panics, and a parsed head never claims more than it was given.
        #[test]
        fn arbitrary_heads(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Ok(Some(head)) = parse_head(&bytes, 256) {
                prop_assert!(head.len <= bytes.len() && head.len <= 256);
                let _ = parse_target(&head.method, &head.target);
            }
        }

        /// No header value, however odd, can put a second request line or header into the
        /// forwarded head: every line of it is one of ours or one the client sent whole.
        #[test]
        fn forwarded_heads_have_one_request(name in "[A-Za-z-]{1,12}", value in "[ -~]{0,30}") {
            let raw = format!("GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n{name}: {value}\r\n\r\n");
            if let Ok(Some(head)) = parse_head(raw.as_bytes(), MAX) {
                if let Ok(fwd) = plain_request(&head, &Host::Name("a.example".into()), 80, "/") {
                    let text = String::from_utf8_lossy(&fwd.head);
                    prop_assert_eq!(text.matches("\r\n\r\n").count(), 1);
                    prop_assert!(text.ends_with("Connection: close\r\n\r\n"));
                    let lower = text.to_ascii_lowercase();
                    prop_assert!(!lower.contains("\r\nproxy-") && !lower.contains("\r\nx-sandgate-"));
                }
            }
        }
    }
}
