//! The OCSF form of an audit event (`sandgate audit export --format ocsf`): each event maps to
//! the closest OCSF class (table in `docs/audit.md`), and carries its own row in
//! `unmapped.sandgate`, so a bundle in OCSF still verifies: [`record`] is a pure function of the
//! row, and `audit verify --bundle` remakes every record from its row and compares.

use serde_json::{json, Map, Value};

use crate::audit::verify::StoredEvent;

/// The OCSF schema version the records follow.
pub const OCSF_VERSION: &str = "1.3.0";

/// The OCSF classes sandgate's events map to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// 1007: execution decisions, cancels, reaps (the sandboxed program is the process).
    ProcessActivity,
    /// 4001: egress connections through the proxy.
    NetworkActivity,
    /// 4002: HTTP requests the proxy decided one by one.
    HttpActivity,
    /// 3002: refused API keys.
    Authentication,
    /// 3001: API keys created, revoked, rotated.
    AccountChange,
    /// 6003: approvals and every other request to the gateway's API.
    ApiActivity,
}

impl Class {
    /// The class of an event kind (`audit_events.kind`).
    pub fn of(kind: &str) -> Class {
        match kind {
            "egress.connection" | "egress.denied.repeated" | "egress.credential.misdirected" => {
                Class::NetworkActivity
            }
            "egress.request" => Class::HttpActivity,
            _ if kind.starts_with("execution.") => Class::ProcessActivity,
            _ if kind.starts_with("auth.") => Class::Authentication,
            _ if kind.starts_with("key.") => Class::AccountChange,
            _ => Class::ApiActivity,
        }
    }

    pub fn uid(self) -> u64 {
        match self {
            Class::ProcessActivity => 1007,
            Class::NetworkActivity => 4001,
            Class::HttpActivity => 4002,
            Class::Authentication => 3002,
            Class::AccountChange => 3001,
            Class::ApiActivity => 6003,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Class::ProcessActivity => "Process Activity",
            Class::NetworkActivity => "Network Activity",
            Class::HttpActivity => "HTTP Activity",
            Class::Authentication => "Authentication",
            Class::AccountChange => "Account Change",
            Class::ApiActivity => "API Activity",
        }
    }

    /// `category_uid`: the class uid's thousands.
    fn category_uid(self) -> u64 {
        self.uid() / 1000
    }
}

/// `(activity_id, activity_name)` of an event in its class; 99 is OCSF's "Other".
fn activity(class: Class, event: &StoredEvent) -> (u64, &'static str) {
    let allowed = event.allow != Some(false);
    match (class, event.kind.as_str()) {
        (Class::ProcessActivity, "execution.decision") => (1, "Launch"),
        (Class::ProcessActivity, _) => (2, "Terminate"),
        (Class::NetworkActivity, "egress.connection") if allowed => (1, "Open"),
        (Class::NetworkActivity, _) => (5, "Refuse"),
        (Class::HttpActivity, _) => http_activity(event.input["method"].as_str()),
        (Class::Authentication, _) => (1, "Logon"),
        (Class::AccountChange, "key.create") => (1, "Create"),
        (Class::AccountChange, "key.revoke") => (5, "Disable"),
        (Class::ApiActivity, "approval.requested") => (1, "Create"),
        (Class::ApiActivity, "approval.approved" | "approval.rejected" | "approval.expired") => {
            (3, "Update")
        }
        _ => (99, "Other"),
    }
}

fn http_activity(method: Option<&str>) -> (u64, &'static str) {
    match method.map(str::to_ascii_uppercase).as_deref() {
        Some("CONNECT") => (1, "Connect"),
        Some("DELETE") => (2, "Delete"),
        Some("GET") => (3, "Get"),
        Some("HEAD") => (4, "Head"),
        Some("OPTIONS") => (5, "Options"),
        Some("POST") => (6, "Post"),
        Some("PUT") => (7, "Put"),
        Some("TRACE") => (8, "Trace"),
        Some("PATCH") => (9, "Patch"),
        _ => (99, "Other"),
    }
}

/// The OCSF record of one event.
pub fn record(event: &StoredEvent) -> Value {
    let class = Class::of(&event.kind);
    let (activity_id, activity_name) = activity(class, event);
    // (action_id, action, disposition_id, status_id, severity_id)
    let (action_id, action, disposition_id, status_id, severity_id) = match event.allow {
        Some(true) => (1, "Allowed", 1, 1, 1),
        Some(false) => (2, "Denied", 2, 2, 3),
        None => (0, "Unknown", 0, 1, 1),
    };
    let mut record = json!({
        "class_uid": class.uid(),
        "class_name": class.name(),
        "category_uid": class.category_uid(),
        "activity_id": activity_id,
        "activity_name": activity_name,
        "type_uid": class.uid() * 100 + activity_id,
        "time": event.at.timestamp_millis(),
        "severity_id": severity_id,
        "action_id": action_id,
        "action": action,
        "disposition_id": disposition_id,
        "status_id": status_id,
        "message": first_reason(&event.reasons),
        "metadata": {
            "version": OCSF_VERSION,
            "uid": event.id,
            "correlation_uid": event.execution_id,
            "log_name": "audit_events",
            "product": {"name": "sandgate", "vendor_name": "sandgate"},
        },
        "actor": {"user": {"uid": event.key_id}},
        "unmapped": {"sandgate": event},
    });
    if let Some(fields) = record.as_object_mut() {
        class_fields(class, event, fields);
    }
    record
}

/// The fields only one class has: the process, the destination, the HTTP request, the API call.
fn class_fields(class: Class, event: &StoredEvent, fields: &mut Map<String, Value>) {
    let input = &event.input;
    let (key, value) = match class {
        Class::ProcessActivity => (
            "process",
            json!({"uid": event.execution_id, "name": input["request"]["language"]}),
        ),
        Class::NetworkActivity => (
            "dst_endpoint",
            json!({"hostname": input["host"], "port": input["port"]}),
        ),
        Class::HttpActivity => (
            "http_request",
            json!({
                "http_method": input["method"],
                "url": {"hostname": input["host"], "port": input["port"], "path": input["path"]},
            }),
        ),
        Class::Authentication | Class::AccountChange => {
            ("user", json!({"uid": event.key_id, "name": event.tenant}))
        }
        Class::ApiActivity => (
            "api",
            json!({"operation": event.kind, "request": {"uid": event.decision_id}}),
        ),
    };
    fields.insert(key.to_owned(), value);
}

fn first_reason(reasons: &Value) -> Value {
    reasons
        .get(0)
        .and_then(|reason| reason.get("message").or_else(|| reason.get("code")))
        .cloned()
        .unwrap_or(Value::Null)
}

/// The row an OCSF record carries, to verify.
pub fn row_of(record: &Value) -> Option<StoredEvent> {
    serde_json::from_value(record.get("unmapped")?.get("sandgate")?.clone()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, allow: Option<bool>, input: Value) -> StoredEvent {
        StoredEvent {
            seq: 7,
            id: "ev_1".into(),
            at: chrono::DateTime::from_timestamp_millis(1_764_547_200_123).unwrap_or_default(),
            kind: kind.into(),
            execution_id: Some("ex_1".into()),
            key_id: None,
            tenant: Some("acme".into()),
            decision_id: Some("eg_1".into()),
            allow,
            reasons: json!([{"code": "egress.denied", "message": "not in the allowlist"}]),
            input,
            decision: json!({}),
            policy_revision: Some("sha256:00".into()),
            prev_hash: "0".repeat(64),
            hash: "1".repeat(64),
            hash_version: crate::audit::chain::HashScheme::Content,
        }
    }

    #[test]
    fn egress_connections_are_network_activity_with_their_destination() {
        let input = json!({"host": "pypi.org", "port": 443, "scheme": "https"});
        let refused = record(&event("egress.connection", Some(false), input.clone()));
        assert_eq!(refused["class_uid"], 4001);
        assert_eq!(refused["category_uid"], 4);
        assert_eq!(refused["activity_id"], 5, "{refused}");
        assert_eq!(refused["type_uid"], 400105);
        assert_eq!(refused["action_id"], 2);
        assert_eq!(refused["dst_endpoint"]["hostname"], "pypi.org");
        assert_eq!(refused["message"], "not in the allowlist");
        assert_eq!(refused["time"], 1_764_547_200_123_i64);
        let opened = record(&event("egress.connection", Some(true), input));
        assert_eq!(opened["type_uid"], 400101);
        assert_eq!(row_of(&opened).map(|row| row.seq), Some(7));
    }

    #[test]
    fn requests_decisions_and_approvals_map_to_their_classes() {
        let get = record(&event(
            "egress.request",
            Some(true),
            json!({"method": "get"}),
        ));
        assert_eq!(
            (get["class_uid"].clone(), get["activity_id"].clone()),
            (json!(4002), json!(3))
        );
        let launch = record(&event("execution.decision", Some(true), json!({})));
        assert_eq!(launch["type_uid"], 100701);
        let approved = record(&event("approval.approved", None, json!({})));
        assert_eq!(approved["type_uid"], 600303);
        assert_eq!(approved["api"]["operation"], "approval.approved");
        assert_eq!(
            record(&event("auth.failure", Some(false), json!({})))["class_uid"],
            3002
        );
        assert_eq!(
            record(&event("key.revoke", None, json!({})))["type_uid"],
            300105
        );
    }
}
