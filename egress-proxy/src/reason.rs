//! The bounded set of reason codes the proxy records and answers with (STYLE 4): each says where
//! it came from (client, upstream, policy or internal) and which HTTP status a denial carries.

use std::fmt;

/// Where a reason came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasonSource {
    /// The sandbox sent something the proxy refuses, or broke a limit.
    Client,
    /// Resolving or reaching the destination failed.
    Upstream,
    /// The egress policy or the address table decided.
    Policy,
    /// The proxy itself (audit store, shutdown).
    Internal,
}

/// Why an attempt was allowed or denied, or why a connection closed. `code()` is what audit
/// rows, denial bodies and logs carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasonCode {
    /// The attempt passed every check (an attempt's reason when allowed).
    Allowed,
    /// The connection ran to its end (a close reason).
    Completed,

    /// No rule of the grant matches the host (`egress.host_not_granted` from the policy).
    HostNotGranted,
    /// The host is granted on other ports (`egress.port_not_granted` from the policy).
    PortNotGranted,
    /// The policy denied with a code of its own (kept in the attempt's `policy_reasons`).
    PolicyDenied,
    /// The policy could not decide (`policy.error`): load, evaluation or shape error.
    PolicyError,
    /// A resolved or literal address is in a denied range or is the gateway's own.
    AddressDenied,
    /// Inside an inspected tunnel: no request rule lists the method (`egress.method_not_allowed`).
    MethodNotAllowed,
    /// Inside an inspected tunnel: the method is listed, not for this path (`egress.path_not_allowed`).
    PathNotAllowed,
    /// A request carries a credential placeholder the policy did not grant for that request, or
    /// anywhere but in the header the credential's configuration names.
    CredentialMisdirected,
    /// Inside an inspected tunnel: the request asks for an `Upgrade` no request rule allows
    /// explicitly (`egress.upgrade_not_allowed`).
    UpgradeNotAllowed,
    /// The execution has no network grant: every attempt is refused, naming how to ask for one.
    NoGrant,
    /// Plain HTTP to a destination whose grant inspects it: inspection needs TLS, and a request
    /// no rule decided is never let through.
    InspectRequiresTls,

    /// The request head is malformed, too large or not a form the proxy serves.
    BadRequest,
    /// The target host is not a valid host in any spelling the proxy accepts.
    HostInvalid,
    /// The request path cannot be normalised (an encoded `/`, `\\` or NUL, a bad escape, a
    /// `..;` segment, ...): the proxy decides only on a path every server reads the same way.
    PathInvalid,
    /// A plain HTTP request's `Host` header is missing, repeated or names another host.
    HostMismatch,
    /// A plain HTTP request whose body framing could be read two ways.
    Smuggling,
    /// The request head, or the ClientHello, did not arrive in time.
    ClientTimeout,
    /// The ClientHello's SNI names another host.
    SniMismatch,
    /// The ClientHello has no SNI, or the client closed before sending one.
    SniMissing,
    /// The first bytes of the tunnel are not a ClientHello with one readable host name.
    SniUnreadable,
    /// The execution already has as many connections open as it may.
    TooManyConnections,
    /// The execution was refused more attempts than it may be (rate or total): this one is
    /// counted into a summary, not recorded on its own.
    TooManyDenials,
    /// The execution's byte budget (up and down, all connections) is spent.
    ByteLimit,
    /// Neither side sent anything for the idle timeout.
    IdleTimeout,
    /// The connection to the sandbox failed while relaying.
    ClientFailed,
    /// Inside an inspected tunnel: the sandbox's TLS handshake with the proxy failed (a client
    /// that pins another certificate, or does not trust the execution's CA).
    ClientTlsFailed,

    /// The name did not resolve (or resolved to nothing).
    DnsFailed,
    /// The resolver did not answer in time.
    DnsTimeout,
    /// The upstream refused or reset the connection.
    UpstreamFailed,
    /// The upstream did not accept the connection in time.
    UpstreamTimeout,
    /// Inside an inspected tunnel: the upstream's certificate did not verify, or its TLS failed.
    UpstreamTlsFailed,

    /// The audit recorder could not record the attempt: nothing was dialled.
    AuditUnavailable,
    /// The execution's listener was closed while the connection was open.
    Shutdown,
}

impl ReasonCode {
    /// Every code, for documentation and tests.
    pub const ALL: [ReasonCode; 35] = [
        ReasonCode::Allowed,
        ReasonCode::Completed,
        ReasonCode::HostNotGranted,
        ReasonCode::PortNotGranted,
        ReasonCode::PolicyDenied,
        ReasonCode::PolicyError,
        ReasonCode::AddressDenied,
        ReasonCode::MethodNotAllowed,
        ReasonCode::PathNotAllowed,
        ReasonCode::CredentialMisdirected,
        ReasonCode::UpgradeNotAllowed,
        ReasonCode::NoGrant,
        ReasonCode::InspectRequiresTls,
        ReasonCode::BadRequest,
        ReasonCode::HostInvalid,
        ReasonCode::PathInvalid,
        ReasonCode::HostMismatch,
        ReasonCode::Smuggling,
        ReasonCode::ClientTimeout,
        ReasonCode::SniMismatch,
        ReasonCode::SniMissing,
        ReasonCode::SniUnreadable,
        ReasonCode::TooManyConnections,
        ReasonCode::TooManyDenials,
        ReasonCode::ByteLimit,
        ReasonCode::IdleTimeout,
        ReasonCode::ClientFailed,
        ReasonCode::ClientTlsFailed,
        ReasonCode::DnsFailed,
        ReasonCode::DnsTimeout,
        ReasonCode::UpstreamFailed,
        ReasonCode::UpstreamTimeout,
        ReasonCode::UpstreamTlsFailed,
        ReasonCode::AuditUnavailable,
        ReasonCode::Shutdown,
    ];

    /// The dotted code written to audit rows and denial bodies.
    pub fn code(self) -> &'static str {
        use ReasonCode::*;
        match self {
            Allowed => "egress.allowed",
            Completed => "egress.completed",
            HostNotGranted => "egress.host_not_granted",
            PortNotGranted => "egress.port_not_granted",
            PolicyDenied => "egress.policy_denied",
            PolicyError => "policy.error",
            AddressDenied => "egress.address_denied",
            MethodNotAllowed => "egress.method_not_allowed",
            PathNotAllowed => "egress.path_not_allowed",
            CredentialMisdirected => "credential.misdirected",
            UpgradeNotAllowed => "egress.upgrade_not_allowed",
            NoGrant => "egress.no_grant",
            InspectRequiresTls => "egress.inspect_requires_tls",
            BadRequest => "egress.bad_request",
            HostInvalid => "egress.host_invalid",
            PathInvalid => "egress.path_invalid",
            HostMismatch => "egress.host_mismatch",
            Smuggling => "egress.smuggling",
            ClientTimeout => "egress.client_timeout",
            SniMismatch => "egress.sni_mismatch",
            SniMissing => "egress.sni_missing",
            SniUnreadable => "egress.sni_unreadable",
            TooManyConnections => "egress.too_many_connections",
            TooManyDenials => "egress.too_many_denials",
            ByteLimit => "egress.byte_limit",
            IdleTimeout => "egress.idle_timeout",
            ClientFailed => "egress.client_failed",
            ClientTlsFailed => "egress.client_tls_failed",
            DnsFailed => "egress.dns_failed",
            DnsTimeout => "egress.dns_timeout",
            UpstreamFailed => "egress.upstream_failed",
            UpstreamTimeout => "egress.upstream_timeout",
            UpstreamTlsFailed => "egress.upstream_tls_failed",
            AuditUnavailable => "egress.audit_unavailable",
            Shutdown => "egress.shutdown",
        }
    }

    /// Where the reason came from; `None` for the two outcomes that are not failures.
    pub fn source(self) -> Option<ReasonSource> {
        use ReasonCode::*;
        Some(match self {
            Allowed | Completed => return None,
            HostNotGranted
            | PortNotGranted
            | PolicyDenied
            | PolicyError
            | AddressDenied
            | MethodNotAllowed
            | PathNotAllowed
            | CredentialMisdirected
            | UpgradeNotAllowed
            | NoGrant
            | InspectRequiresTls => ReasonSource::Policy,
            BadRequest | HostInvalid | PathInvalid | HostMismatch | Smuggling | ClientTimeout
            | SniMismatch | SniMissing | SniUnreadable | TooManyConnections | TooManyDenials
            | ByteLimit | IdleTimeout | ClientFailed | ClientTlsFailed => ReasonSource::Client,
            DnsFailed | DnsTimeout | UpstreamFailed | UpstreamTimeout | UpstreamTlsFailed => {
                ReasonSource::Upstream
            }
            AuditUnavailable | Shutdown => ReasonSource::Internal,
        })
    }

    /// The status a denial with this reason answers with (when an HTTP answer is still possible).
    pub fn status(self) -> u16 {
        use ReasonCode::*;
        match self {
            Allowed | Completed => 200,
            HostNotGranted
            | PortNotGranted
            | PolicyDenied
            | PolicyError
            | AddressDenied
            | MethodNotAllowed
            | PathNotAllowed
            | CredentialMisdirected
            | UpgradeNotAllowed
            | NoGrant
            | InspectRequiresTls
            | SniMismatch
            | SniMissing
            | SniUnreadable
            | ByteLimit => 403,
            BadRequest | HostInvalid | PathInvalid | HostMismatch | Smuggling | ClientFailed
            | ClientTlsFailed => 400,
            ClientTimeout => 408,
            TooManyConnections | TooManyDenials => 429,
            DnsFailed | UpstreamFailed | UpstreamTlsFailed => 502,
            DnsTimeout | UpstreamTimeout | IdleTimeout => 504,
            AuditUnavailable | Shutdown => 503,
        }
    }

    /// Maps a policy reason code onto the bounded set (unknown codes are `PolicyDenied`).
    pub fn from_policy(code: &str) -> ReasonCode {
        match code {
            "egress.host_not_granted" => ReasonCode::HostNotGranted,
            "egress.port_not_granted" => ReasonCode::PortNotGranted,
            "egress.method_not_allowed" => ReasonCode::MethodNotAllowed,
            "egress.path_not_allowed" => ReasonCode::PathNotAllowed,
            "egress.upgrade_not_allowed" => ReasonCode::UpgradeNotAllowed,
            policy_engine::POLICY_ERROR_CODE => ReasonCode::PolicyError,
            _ => ReasonCode::PolicyDenied,
        }
    }
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// Most characters of a message in a denial body.
const MAX_MESSAGE: usize = 300;

/// Makes a message safe for a one-line body and an audit row: no control characters, bounded.
pub(crate) fn one_line(message: &str) -> String {
    let mut out: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_MESSAGE)
        .collect();
    if message.chars().count() > MAX_MESSAGE {
        out.push_str("...");
    }
    out
}

/// The denial's one line, `sandgate-egress: <code>: <message>`: the body of every denial, and
/// (see [`reason_phrase`]) its status line's reason phrase, so that a client that shows only the
/// status line (`Tunnel connection failed: 403 sandgate-egress: egress.host_not_granted: ...`)
/// still shows why.
pub(crate) fn denial_line(code: &str, message: &str) -> String {
    format!("sandgate-egress: {code}: {}", one_line(message))
}

/// Longest policy reason code shown in a denial.
const MAX_POLICY_CODE: usize = 64;

/// The code a denial shows the sandbox: the policy's own code when the policy denied (so a
/// program can tell two rules apart, issue 21 item 12), else the reason's. A policy code is
/// shown only when it is a plain dotted identifier (`a-z 0-9 . _ -`, at most 64 characters);
/// the audit row and the metrics keep the bounded [`ReasonCode`] either way.
pub(crate) fn shown_code(reason: ReasonCode, policy_code: Option<&str>) -> String {
    let plain = |code: &str| {
        !code.is_empty()
            && code.len() <= MAX_POLICY_CODE
            && code
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    };
    match policy_code {
        Some(code) if reason.source() == Some(ReasonSource::Policy) && plain(code) => {
            code.to_owned()
        }
        _ => reason.code().to_owned(),
    }
}

/// [`denial_line`] as a reason phrase (RFC 9112: tab, space, visible ASCII; anything else, which
/// only a policy's message could hold, becomes `?`).
pub(crate) fn reason_phrase(code: &str, message: &str) -> String {
    denial_line(code, message)
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

/// The uniform denial answer: `HTTP/1.1 <status> sandgate-egress: <code>: <message>`, a few
/// headers (`X-Sandgate-Reason: <code>`), and the same line as the body.
pub(crate) fn denial_response(reason: ReasonCode, code: &str, message: &str) -> Vec<u8> {
    let status = reason.status();
    let body = format!("{}\n", denial_line(code, message));
    format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nX-Sandgate-Reason: {code}\r\nConnection: close\r\n\r\n{body}",
        reason_phrase(code, message),
        body.len(),
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_dotted() {
        let mut codes: Vec<&str> = ReasonCode::ALL.iter().map(|r| r.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), ReasonCode::ALL.len());
        for code in codes {
            assert!(
                code.starts_with("egress.")
                    || code == "policy.error"
                    || code == "credential.misdirected",
                "{code}"
            );
        }
    }

    #[test]
    fn denial_bodies_are_one_line() {
        let response = denial_response(
            ReasonCode::HostNotGranted,
            "egress.host_not_granted",
            "a\r\nX-Injected: 1",
        );
        let text = String::from_utf8(response).unwrap();
        assert!(
            text.starts_with(
                "HTTP/1.1 403 sandgate-egress: egress.host_not_granted: a  X-Injected: 1\r\n"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("\r\n\r\nsandgate-egress: egress.host_not_granted: a  X-Injected: 1\n"),
            "{text}"
        );
        assert_eq!(
            ReasonCode::from_policy("policy.error"),
            ReasonCode::PolicyError
        );
        assert_eq!(
            ReasonCode::from_policy("tenant.suspended"),
            ReasonCode::PolicyDenied
        );
        assert!(one_line(&"x".repeat(1000)).len() < 310);
    }

    #[test]
    fn a_policy_denial_shows_the_policy_code_when_it_is_plain() {
        let denied = ReasonCode::from_policy("tenant.suspended");
        assert_eq!(
            shown_code(denied, Some("tenant.suspended")),
            "tenant.suspended"
        );
        assert_eq!(
            shown_code(denied, Some("Tenant: suspended\r\n")),
            "egress.policy_denied"
        );
        assert_eq!(
            shown_code(denied, Some(&"a".repeat(65))),
            "egress.policy_denied"
        );
        assert_eq!(shown_code(denied, None), "egress.policy_denied");
        // Only a policy's denial shows a policy code.
        assert_eq!(
            shown_code(ReasonCode::Smuggling, Some("x.y")),
            "egress.smuggling"
        );
    }

    #[test]
    fn reason_phrases_are_visible_ascii() {
        let phrase = reason_phrase("egress.policy_denied", "tenant \"zürich\"\tis\u{7f}off");
        assert_eq!(
            phrase,
            "sandgate-egress: egress.policy_denied: tenant \"z?rich\" is off"
        );
        assert!(hyper::ext::ReasonPhrase::try_from(phrase).is_ok());
    }
}
