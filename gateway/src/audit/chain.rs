//! The hash chain over `audit_events`: `hash = sha256(prev_hash || canonical JSON of the row)`.
//! Appends take a transaction-scoped advisory lock so concurrent writers extend one linear chain.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sqlx::{Postgres, Transaction};

/// `prev_hash` of the first event.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Advisory lock key serialising appends to the chain ("sgaudit" in ASCII).
const CHAIN_LOCK: i64 = 0x0073_6761_7564_6974;

/// One event to append. `input` must already be free of secrets.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub kind: &'static str,
    pub execution_id: Option<String>,
    pub key_id: Option<String>,
    pub tenant: Option<String>,
    pub decision_id: Option<String>,
    pub allow: Option<bool>,
    pub reasons: Value,
    pub input: Value,
    pub decision: Value,
    pub policy_revision: Option<String>,
}

/// One chained row, as hashed: borrowed from a new event or from a stored one.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    pub seq: i64,
    pub id: &'a str,
    pub at: &'a DateTime<Utc>,
    pub kind: &'a str,
    pub execution_id: Option<&'a str>,
    pub key_id: Option<&'a str>,
    pub tenant: Option<&'a str>,
    pub decision_id: Option<&'a str>,
    pub allow: Option<bool>,
    pub reasons: &'a Value,
    pub input: &'a Value,
    pub decision: &'a Value,
    pub policy_revision: Option<&'a str>,
}

impl NewEvent {
    fn row<'a>(&'a self, seq: i64, id: &'a str, at: &'a DateTime<Utc>) -> Row<'a> {
        Row {
            seq,
            id,
            at,
            kind: self.kind,
            execution_id: self.execution_id.as_deref(),
            key_id: self.key_id.as_deref(),
            tenant: self.tenant.as_deref(),
            decision_id: self.decision_id.as_deref(),
            allow: self.allow,
            reasons: &self.reasons,
            input: &self.input,
            decision: &self.decision,
            policy_revision: self.policy_revision.as_deref(),
        }
    }
}

/// The bytes hashed for a row: its fields as compact JSON with sorted keys.
pub fn canonical(row: &Row<'_>) -> Vec<u8> {
    // serde_json's map is ordered by key, so this serialisation is canonical.
    let json = json!({
        "seq": row.seq,
        "id": row.id,
        "at": row.at.to_rfc3339_opts(SecondsFormat::Micros, true),
        "kind": row.kind,
        "execution_id": row.execution_id,
        "key_id": row.key_id,
        "tenant": row.tenant,
        "decision_id": row.decision_id,
        "allow": row.allow,
        "reasons": row.reasons,
        "input": row.input,
        "decision": row.decision,
        "policy_revision": row.policy_revision,
    });
    json.to_string().into_bytes()
}

pub fn link(prev_hash: &str, canonical: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(prev_hash.as_bytes());
    hasher.update(canonical);
    hex::encode(hasher.finalize())
}

/// Appends `event` inside `tx`; the caller commits. Returns the new event's id.
pub async fn append(
    tx: &mut Transaction<'_, Postgres>,
    event: &NewEvent,
) -> Result<String, sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(CHAIN_LOCK)
        .execute(&mut **tx)
        .await?;
    let head: Option<(i64, String)> =
        sqlx::query_as("SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1")
            .fetch_optional(&mut **tx)
            .await?;
    let (seq, prev_hash) = match head {
        Some((seq, hash)) => (seq + 1, hash),
        None => (1, GENESIS.to_owned()),
    };
    let id = crate::ids::new("ev");
    let at = crate::ids::now_micros();
    let hash = link(&prev_hash, &canonical(&event.row(seq, &id, &at)));
    sqlx::query(
        "INSERT INTO audit_events (seq, id, at, kind, execution_id, key_id, tenant, decision_id, \
         allow, reasons, input, decision, policy_revision, prev_hash, hash) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
    )
    .bind(seq)
    .bind(&id)
    .bind(at)
    .bind(event.kind)
    .bind(&event.execution_id)
    .bind(&event.key_id)
    .bind(&event.tenant)
    .bind(&event.decision_id)
    .bind(event.allow)
    .bind(&event.reasons)
    .bind(&event.input)
    .bind(&event.decision)
    .bind(&event.policy_revision)
    .bind(&prev_hash)
    .bind(&hash)
    .execute(&mut **tx)
    .await?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> NewEvent {
        NewEvent {
            kind: "execution.decision",
            execution_id: Some("ex_1".into()),
            key_id: Some("key_1".into()),
            tenant: Some("acme".into()),
            decision_id: Some("dc_1".into()),
            allow: Some(true),
            reasons: json!([]),
            input: json!({"b": 1, "a": 2}),
            decision: json!({"allow": true}),
            policy_revision: Some("sha256:00".into()),
        }
    }

    #[test]
    fn canonical_form_sorts_keys_and_changes_with_content() {
        let at = DateTime::parse_from_rfc3339("2026-11-30T00:00:00.123456Z")
            .unwrap()
            .with_timezone(&Utc);
        let event = event();
        let bytes = String::from_utf8(canonical(&event.row(1, "ev_1", &at))).unwrap();
        assert!(bytes.contains(r#""input":{"a":2,"b":1}"#), "{bytes}");
        assert!(bytes.contains("2026-11-30T00:00:00.123456Z"), "{bytes}");
        let mut denied = event.clone();
        denied.allow = Some(false);
        let a = link(GENESIS, bytes.as_bytes());
        let b = link(GENESIS, &canonical(&denied.row(1, "ev_1", &at)));
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
    }
}
