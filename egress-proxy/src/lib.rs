//! sandgate's egress proxy: a filtering HTTP/1.1 forward proxy served on per-execution Unix
//! sockets inside the gateway process.
//!
//! Not built yet: until it lands, no execution is granted network access (the gateway denies
//! any decision that grants it), so sandboxes have no way out at all. What is here is the
//! host canonicalisation the proxy's decisions will start from.

/// Why a host name was refused before any policy decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("host is empty")]
    Empty,
    #[error("host contains control characters or whitespace")]
    ControlCharacter,
}

/// Lower-cases a host and drops one trailing dot; refuses empty hosts and control characters.
pub fn canonical_host(host: &str) -> Result<String, HostError> {
    if host.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(HostError::ControlCharacter);
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() {
        return Err(HostError::Empty);
    }
    Ok(host.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonicalises_case_and_trailing_dot() {
        assert_eq!(canonical_host("PyPI.org.").unwrap(), "pypi.org");
        assert_eq!(canonical_host(".").unwrap_err(), HostError::Empty);
        assert_eq!(
            canonical_host("a\nb").unwrap_err(),
            HostError::ControlCharacter
        );
    }
}
