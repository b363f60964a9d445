//! The `proxy` field of the job spec: where the bridge ([`crate::bridge`]) listens inside the
//! sandbox, and the Unix socket it relays to.

use std::net::SocketAddr;
use std::path::PathBuf;

use thiserror::Error;

use super::{normal_components, shown, PathError, SpecError};

/// Longest accepted Unix socket path, in bytes: `sun_path` holds 108 with the final NUL.
pub const MAX_SOCKET_PATH_LEN: usize = 107;

/// The wire form: both fields required, nothing else.
pub(super) type WireProxy = sandbox_protocol::JobProxy;

/// The proxy bridge's settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proxy {
    /// A loopback address (`127.0.0.0/8` or `::1`) with a non-zero port.
    pub listen: SocketAddr,
    /// Absolute, canonically spelled Unix socket path of at most [`MAX_SOCKET_PATH_LEN`] bytes.
    pub socket: PathBuf,
}

/// Why a proxy listen address was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ListenError {
    #[error("is not an IP address and port, such as 127.0.0.1:3128")]
    NotAnAddress,
    #[error("is not a loopback address")]
    NotLoopback,
    #[error("has port 0")]
    PortZero,
}

/// Validates the wire form into a [`Proxy`].
pub(super) fn validate(wire: WireProxy) -> Result<Proxy, SpecError> {
    let listen = validate_listen(&wire.listen).map_err(|reason| SpecError::ProxyListen {
        listen: shown(&wire.listen),
        reason,
    })?;
    let socket = validate_socket_path(&wire.socket).map_err(|reason| SpecError::ProxySocket {
        socket: shown(&wire.socket),
        reason,
    })?;
    Ok(Proxy { listen, socket })
}

/// Accepts `IPv4:port` or `[IPv6]:port` (no host name) on a loopback address, port not 0. An
/// IPv6 scope id or flow label, meaningless on loopback, is dropped.
pub fn validate_listen(listen: &str) -> Result<SocketAddr, ListenError> {
    let addr: SocketAddr = listen.parse().map_err(|_| ListenError::NotAnAddress)?;
    if !addr.ip().is_loopback() {
        return Err(ListenError::NotLoopback);
    }
    if addr.port() == 0 {
        return Err(ListenError::PortZero);
    }
    Ok(SocketAddr::new(addr.ip(), addr.port()))
}

/// Accepts any absolute path spelled canonically (as [`super::validate_cwd`]) that fits in a
/// Unix socket address. Whether a socket is there is found out at each connection.
pub fn validate_socket_path(path: &str) -> Result<PathBuf, PathError> {
    normal_components(path)?;
    if path.len() > MAX_SOCKET_PATH_LEN {
        return Err(PathError::SocketTooLong);
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::super::parse_job;
    use super::*;

    #[test]
    fn proxy_is_optional_and_needs_both_fields() {
        let job = parse_job(
            br#"{"argv":["true"],"proxy":{"listen":"127.0.0.1:3128","socket":"/run/sandgate/egress.sock"}}"#,
        )
        .unwrap();
        let expected = Proxy {
            listen: SocketAddr::from(([127, 0, 0, 1], 3128)),
            socket: PathBuf::from("/run/sandgate/egress.sock"),
        };
        assert_eq!(job.proxy, Some(expected));
        assert_eq!(parse_job(br#"{"argv":["true"]}"#).unwrap().proxy, None);
        assert_eq!(
            parse_job(br#"{"argv":["true"],"proxy":null}"#)
                .unwrap()
                .proxy,
            None
        );
        for line in [
            &br#"{"argv":["true"],"proxy":{}}"#[..],
            br#"{"argv":["true"],"proxy":{"listen":"127.0.0.1:3128"}}"#,
            br#"{"argv":["true"],"proxy":{"socket":"/s"}}"#,
            br#"{"argv":["true"],"proxy":{"listen":3128,"socket":"/s"}}"#,
            br#"{"argv":["true"],"proxy":"127.0.0.1:3128"}"#,
        ] {
            assert!(
                matches!(parse_job(line), Err(SpecError::Json(_))),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn proxy_listens_on_loopback_only() {
        use ListenError::*;
        for (listen, expected) in [
            ("127.0.0.1:3128", "127.0.0.1:3128"),
            ("127.0.0.53:1", "127.0.0.53:1"),
            ("127.255.255.254:65535", "127.255.255.254:65535"),
            ("[::1]:3128", "[::1]:3128"),
            ("[0:0:0:0:0:0:0:1]:3128", "[::1]:3128"),
        ] {
            let addr = validate_listen(listen).unwrap();
            assert_eq!(addr.to_string(), expected, "{listen}");
        }
        for (listen, expected) in [
            ("", NotAnAddress),
            ("localhost:3128", NotAnAddress),
            ("127.0.0.1", NotAnAddress),
            ("127.1:3128", NotAnAddress),
            ("2130706433:3128", NotAnAddress),
            ("127.0.0.1:65536", NotAnAddress),
            (" 127.0.0.1:3128", NotAnAddress),
            ("127.0.0.1:3128\n", NotAnAddress),
            ("::1:3128", NotAnAddress),
            ("0.0.0.0:3128", NotLoopback),
            ("10.0.0.1:3128", NotLoopback),
            ("169.254.169.254:80", NotLoopback),
            ("[::]:3128", NotLoopback),
            ("[::ffff:127.0.0.1]:3128", NotLoopback),
            ("127.0.0.1:0", PortZero),
            ("[::1]:0", PortZero),
        ] {
            assert_eq!(validate_listen(listen), Err(expected), "{listen:?}");
        }
        let err =
            parse_job(br#"{"argv":["true"],"proxy":{"listen":"0.0.0.0:3128","socket":"/s"}}"#)
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            "proxy listen \"0.0.0.0:3128\": is not a loopback address"
        );
    }

    #[test]
    fn proxy_socket_is_a_canonical_absolute_path_that_fits() {
        use PathError::*;
        let longest = format!("/run/{}", "s".repeat(MAX_SOCKET_PATH_LEN - 5));
        assert_eq!(longest.len(), MAX_SOCKET_PATH_LEN);
        for path in ["/run/sandgate/egress.sock", "/s", &longest] {
            assert_eq!(validate_socket_path(path), Ok(PathBuf::from(path)));
        }
        let too_long = format!("{longest}s");
        for (path, expected) in [
            ("run/sandgate/egress.sock", NotAbsolute),
            ("", NotAbsolute),
            ("/run/sandgate/../egress.sock", ParentDir),
            ("/run//egress.sock", EmptyComponent),
            ("/run/sandgate/", EmptyComponent),
            ("/run/egress\n.sock", ControlChar),
            (&too_long, SocketTooLong),
        ] {
            assert_eq!(validate_socket_path(path), Err(expected), "{path:?}");
        }
        let err = parse_job(
            br#"{"argv":["true"],"proxy":{"listen":"127.0.0.1:3128","socket":"egress.sock"}}"#,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "proxy socket \"egress.sock\": is not absolute"
        );
    }
}
