//! Host patterns of network grants: what a valid one looks like, checked twice so that a bad
//! allowlist never reaches the egress proxy.
//!
//! - at **decide** time, on every network grant a decision returns (a bad one is a `policy.error`
//!   deny, whatever the policy meant);
//! - at **load** time, on the data document, by convention (`policies/README.md`, "Host patterns
//!   in data"): every mapping with a `host` key is a host rule (`host` a valid pattern; `ports`,
//!   when present, a non-empty list of ports 1-65535), and every list under a key named `hosts` is
//!   a list of patterns. A typo in `data/*.yaml` then fails the load (and so a reload) instead of
//!   denying requests in production.
//!
//! A pattern is a lower-case host name (`pypi.org`), an IPv4 literal in dotted-quad form, or `*.`
//! followed by a name of at least two labels (`*.pythonhosted.org`), which matches names below it
//! on label boundaries only. Refused: `*`, `*.<one label>` (`*.com`), a wildcard anywhere else, an
//! empty name or label, a trailing dot, upper case, and characters outside `[a-z0-9_-]` in a label.
//! IPv6 literals cannot be granted yet.

use serde_json::{Map, Value};

use crate::NetworkGrant;

/// Longest host name DNS allows, in characters, dots included.
const MAX_NAME_LEN: usize = 253;
/// Longest DNS label.
const MAX_LABEL_LEN: usize = 63;
/// The only wildcard form: a whole leading label.
const WILDCARD_PREFIX: &str = "*.";

/// Checks one host pattern of a grant or of policy data; the error says what is wrong with it.
pub fn validate_host_pattern(pattern: &str) -> Result<(), String> {
    let invalid = |why: &str| Err(format!("host pattern {pattern:?} {why}"));
    if pattern.is_empty() {
        return invalid("is empty");
    }
    if pattern == "*" {
        return invalid("would match every host");
    }
    let (wildcard, name) = match pattern.strip_prefix(WILDCARD_PREFIX) {
        Some(rest) => (true, rest),
        None => (false, pattern),
    };
    if name.contains('*') {
        return invalid("has a wildcard that is not a leading `*.` label");
    }
    if name.len() > MAX_NAME_LEN {
        return invalid("is longer than 253 characters");
    }
    if name.chars().any(|c| c.is_ascii_uppercase()) {
        return invalid("is not lower case");
    }
    let labels: Vec<&str> = name.split('.').collect();
    if labels.iter().any(|label| label.is_empty()) {
        return invalid("has an empty label (leading, trailing or double dot)");
    }
    if let Some(label) = labels.iter().find(|label| !valid_label(label)) {
        return invalid(&format!(
            "has an invalid label {label:?} (1-63 of a-z, 0-9, `-`, `_`)"
        ));
    }
    if wildcard && labels.len() < 2 {
        return invalid("is too broad: `*.` must be followed by at least two labels");
    }
    Ok(())
}

fn valid_label(label: &str) -> bool {
    label.len() <= MAX_LABEL_LEN
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Checks every host rule of a grant a decision returned.
pub(crate) fn validate_grant(grant: &NetworkGrant) -> Result<(), String> {
    for rule in &grant.allow {
        validate_host_pattern(&rule.host).map_err(|err| format!("invalid network grant: {err}"))?;
        if rule.ports.is_empty() {
            return Err(format!(
                "invalid network grant: host {:?} has no ports",
                rule.host
            ));
        }
        if rule.ports.contains(&0) {
            return Err(format!(
                "invalid network grant: host {:?} has port 0",
                rule.host
            ));
        }
        if !rule.credentials.is_empty() && !rule.inspect {
            return Err(format!(
                "invalid network grant: host {:?} names credentials without `inspect: true` \
                 (a credential is only ever attached inside an inspected tunnel)",
                rule.host
            ));
        }
    }
    Ok(())
}

/// Checks that an egress decision attaches only credentials the grant lists for the host.
pub(crate) fn validate_credentials(
    input: &crate::EgressInput,
    decision: &crate::EgressDecision,
) -> Result<(), String> {
    if decision.credentials.is_empty() {
        return Ok(());
    }
    if !decision.allow {
        return Err("a deny names credentials to attach".to_string());
    }
    if input.connection.method.is_none() {
        return Err(
            "credentials named for a connection, not a request inside a tunnel".to_string(),
        );
    }
    let host = &input.connection.host;
    let granted = |name: &String| {
        input
            .execution
            .grant
            .allow
            .iter()
            .any(|rule| rule.inspect && rule.covers(host) && rule.credentials.contains(name))
    };
    match decision.credentials.iter().find(|name| !granted(name)) {
        Some(name) => Err(format!(
            "the decision attaches credential {name:?}, which the grant does not list for {host}"
        )),
        None => Ok(()),
    }
}

/// Checks the host patterns found in one data file by the convention in the module docs. The error
/// names the offending value by its path in the file (`tenants.acme.network.allow[0].host`).
pub(crate) fn validate_data(mapping: &Map<String, Value>) -> Result<(), String> {
    validate_object(mapping, &mut String::new())
}

fn validate_object(mapping: &Map<String, Value>, path: &mut String) -> Result<(), String> {
    if let Some(host) = mapping.get("host") {
        validate_host_rule(host, mapping.get("ports"), path)?;
    }
    for (key, child) in mapping {
        let len = path.len();
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
        if key == "hosts" {
            validate_host_list(child, path)?;
        }
        validate_value(child, path)?;
        path.truncate(len);
    }
    Ok(())
}

fn validate_value(value: &Value, path: &mut String) -> Result<(), String> {
    match value {
        Value::Object(mapping) => validate_object(mapping, path),
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{index}]"));
                validate_value(item, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn validate_host_rule(host: &Value, ports: Option<&Value>, path: &str) -> Result<(), String> {
    let at = |field: &str| {
        if path.is_empty() {
            field.to_string()
        } else {
            format!("{path}.{field}")
        }
    };
    let Value::String(host) = host else {
        return Err(format!("{}: a host must be a string", at("host")));
    };
    validate_host_pattern(host).map_err(|err| format!("{}: {err}", at("host")))?;
    let Some(ports) = ports else {
        return Ok(());
    };
    let ports_err = || {
        Err(format!(
            "{}: ports must be a non-empty list of numbers 1-65535",
            at("ports")
        ))
    };
    let Value::Array(ports) = ports else {
        return ports_err();
    };
    if ports.is_empty() {
        return ports_err();
    }
    for port in ports {
        if !port
            .as_u64()
            .is_some_and(|port| (1..=u64::from(u16::MAX)).contains(&port))
        {
            return ports_err();
        }
    }
    Ok(())
}

fn validate_host_list(hosts: &Value, path: &str) -> Result<(), String> {
    let Value::Array(hosts) = hosts else {
        return Err(format!(
            "{path}: a `hosts` entry must be a list of host patterns"
        ));
    };
    for (index, host) in hosts.iter().enumerate() {
        let Value::String(host) = host else {
            return Err(format!("{path}[{index}]: a host must be a string"));
        };
        validate_host_pattern(host).map_err(|err| format!("{path}[{index}]: {err}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Connection, EgressDecision, EgressExecution, EgressInput, HostRule};

    fn inspected(credentials: &[&str]) -> HostRule {
        HostRule {
            inspect: true,
            credentials: credentials.iter().map(|c| (*c).to_owned()).collect(),
            ..HostRule::new("api.example.com", vec![443])
        }
    }

    fn grant(rules: Vec<HostRule>) -> NetworkGrant {
        NetworkGrant {
            allow: rules,
            max_connections: 1,
            max_bytes: 1,
            max_denied: None,
            max_denied_per_s: None,
        }
    }

    #[test]
    fn credentials_need_inspection_in_a_grant() {
        assert!(validate_grant(&grant(vec![inspected(&["github"])])).is_ok());
        let uninspected = HostRule {
            inspect: false,
            ..inspected(&["github"])
        };
        let err = validate_grant(&grant(vec![uninspected])).unwrap_err();
        assert!(err.contains("without `inspect: true`"), "{err}");
    }

    #[test]
    fn a_decision_attaches_only_credentials_the_hosts_rule_lists() {
        let input = |method: Option<&str>, host: &str| EgressInput {
            execution: EgressExecution {
                id: "ex_1".into(),
                tenant: "acme".into(),
                grant: grant(vec![inspected(&["github"])]),
            },
            connection: Connection {
                host: host.into(),
                port: 443,
                scheme: "https".into(),
                method: method.map(str::to_owned),
                path: Some("/".into()),
                query: None,
                headers: Some(vec![]),
                upgrade: None,
            },
        };
        let attach = |name: &str| EgressDecision {
            allow: true,
            reasons: vec![],
            credentials: vec![name.to_owned()],
            upgrade: false,
        };
        let get = input(Some("GET"), "api.example.com");
        assert!(validate_credentials(&get, &attach("github")).is_ok());
        assert!(validate_credentials(&get, &attach("other")).is_err());
        assert!(
            validate_credentials(&input(Some("GET"), "x.example.com"), &attach("github")).is_err()
        );
        assert!(validate_credentials(&input(None, "api.example.com"), &attach("github")).is_err());
        let wildcard = HostRule::new("*.example.com", vec![443]);
        assert!(wildcard.covers("a.b.example.com") && !wildcard.covers("example.com"));
        assert!(!wildcard.covers("badexample.com"));
    }

    #[test]
    fn valid_patterns() {
        for pattern in [
            "pypi.org",
            "files.pythonhosted.org",
            "*.pythonhosted.org",
            "*.co.uk",
            "localhost",
            "10.0.0.1",
            "under_score.example",
            "xn--bcher-kva.example",
        ] {
            assert_eq!(validate_host_pattern(pattern), Ok(()), "{pattern}");
        }
    }

    #[test]
    fn invalid_patterns() {
        for (pattern, why) in [
            ("", "is empty"),
            ("*", "every host"),
            ("*.com", "too broad"),
            ("*.", "empty label"),
            ("**.example.com", "wildcard"),
            ("*example.com", "wildcard"),
            ("a.*.example.com", "wildcard"),
            ("example.*", "wildcard"),
            ("*.*.example.com", "wildcard"),
            ("PyPI.org", "lower case"),
            ("pypi.org.", "empty label"),
            (".pypi.org", "empty label"),
            ("pypi..org", "empty label"),
            ("pypi.org:443", "invalid label"),
            ("py pi.org", "invalid label"),
            ("pypi.org/simple", "invalid label"),
            ("::1", "invalid label"),
        ] {
            let err = validate_host_pattern(pattern).unwrap_err();
            assert!(err.contains(why), "{pattern:?}: {err}");
        }
        let long_label = format!("{}.example", "a".repeat(64));
        assert!(validate_host_pattern(&long_label).is_err());
        let long_name = ["abcdefghi"; 26].join(".");
        assert!(long_name.len() > MAX_NAME_LEN);
        assert!(validate_host_pattern(&long_name).is_err());
    }

    #[test]
    fn data_convention() {
        let good = serde_json::json!({
            "tenants": {"acme": {"network": {
                "allow": [{"host": "pypi.org", "ports": [443]}, {"host": "*.example.org"}],
                "hosts": ["a.example", "*.b.example"]}}},
            "other": [{"name": "no host here"}]
        });
        assert_eq!(validate_data(good.as_object().unwrap()), Ok(()));

        for (bad, needle) in [
            (
                serde_json::json!({"tenants": {"acme": {"network": {"allow": [{"host": "*", "ports": [443]}]}}}}),
                "tenants.acme.network.allow[0].host: host pattern \"*\"",
            ),
            (
                serde_json::json!({"t": {"allow": [{"host": "ok.example", "ports": [0]}]}}),
                "t.allow[0].ports: ports must be",
            ),
            (
                serde_json::json!({"t": {"allow": [{"host": "ok.example", "ports": []}]}}),
                "t.allow[0].ports",
            ),
            (
                serde_json::json!({"t": {"allow": [{"host": "ok.example", "ports": [70000]}]}}),
                "t.allow[0].ports",
            ),
            (
                serde_json::json!({"t": {"allow": [{"host": "ok.example", "ports": 443}]}}),
                "t.allow[0].ports",
            ),
            (
                serde_json::json!({"t": {"allow": [{"host": 3}]}}),
                "t.allow[0].host: a host must be a string",
            ),
            (
                serde_json::json!({"t": {"hosts": ["*.com"]}}),
                "t.hosts[0]: host pattern \"*.com\"",
            ),
            (
                serde_json::json!({"hosts": "a.example"}),
                "hosts: a `hosts` entry",
            ),
            (
                serde_json::json!({"host": "Upper.example"}),
                "host: host pattern",
            ),
        ] {
            let err = validate_data(bad.as_object().unwrap()).unwrap_err();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }
}
