//! The hash chain over `audit_events`: each row's `hash` links its content to `prev_hash`, by the
//! row's [`HashScheme`] ([`hash`], the one definition). Appends take a transaction-scoped
//! advisory lock so concurrent writers (every task and every replica on the database) extend one
//! linear chain; a batch ([`append_many`]) holds it once.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sqlx::{Postgres, Transaction};

/// `prev_hash` of the first event.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Advisory lock key serialising appends to the chain ("sgaudit" in ASCII).
pub const CHAIN_LOCK: i64 = 0x0073_6761_7564_6974;

/// How a row's `hash` is made from its `prev_hash` and content; stored with the row
/// (`audit_events.hash_version`), so a chain written before scheme 2 still verifies as written.
///
/// The two preimages cannot be confused: after the 64 hex digits of `prev_hash`, scheme 1 hashes
/// the canonical JSON (which starts with `{`) and scheme 2 hashes 192 hex digits. So a hash
/// commits to its scheme, and relabelling a row's scheme breaks its hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type, Serialize, Deserialize)]
#[repr(i16)]
#[serde(into = "i16", try_from = "i16")]
pub enum HashScheme {
    /// `sha256(prev_hash || canonical)`: every event written before migration
    /// `20261204300000_audit_hash_scheme.sql`. Its link cannot be checked without its content.
    Whole = 1,
    /// `sha256(prev_hash || stamp || tenant_tag || content_hash)` ([`stamp`], [`tenant_tag`],
    /// [`content_hash`]): its link can be checked without the content, so a bundle that hides an
    /// event still proves its link, its `seq` and `at` (so whether it falls in the bundle's
    /// window), and that it is not of the bundle's tenant.
    Content = 2,
}

/// The scheme new events are written with.
pub const SCHEME: HashScheme = HashScheme::Content;

impl From<HashScheme> for i16 {
    fn from(scheme: HashScheme) -> i16 {
        scheme as i16
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown hash scheme {0} (this sandgate knows 1 and 2)")]
pub struct HashSchemeError(i16);

impl TryFrom<i16> for HashScheme {
    type Error = HashSchemeError;
    fn try_from(value: i16) -> Result<HashScheme, HashSchemeError> {
        match value {
            1 => Ok(HashScheme::Whole),
            2 => Ok(HashScheme::Content),
            other => Err(HashSchemeError(other)),
        }
    }
}

/// One event to append. `input` must already be free of secrets.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub kind: api_types::EventKind,
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
            kind: self.kind.as_str(),
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
        "at": time_text(row.at),
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

/// The row's `hash` after `prev_hash` by `scheme`: the chain's one hash definition.
pub fn hash(scheme: HashScheme, prev_hash: &str, row: &Row<'_>) -> String {
    match scheme {
        HashScheme::Whole => sha256_hex(prev_hash, &canonical(row)),
        HashScheme::Content => link_parts(
            prev_hash,
            &stamp(row.seq, row.at),
            &tenant_tag(row.seq, row.tenant),
            &content_hash(row),
        ),
    }
}

/// `at` as every hash takes it: RFC 3339 in UTC with microseconds (what the column stores).
pub fn time_text(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// A scheme-2 row's `stamp`: `hex(sha256({"at":..,"seq":..}))`. A bundle shows a hidden event's
/// `seq` and `at` and recomputes this from them, so the time of an event it hides is proven:
/// an event of the window cannot be passed off as one after it.
pub fn stamp(seq: i64, at: &DateTime<Utc>) -> String {
    let json = json!({"at": time_text(at), "seq": seq});
    hex::encode(Sha256::digest(json.to_string().as_bytes()))
}

/// A scheme-2 row's `content_hash`: `hex(sha256(canonical))`, what a bundle shows of an event
/// whose content it hides.
pub fn content_hash(row: &Row<'_>) -> String {
    hex::encode(Sha256::digest(canonical(row)))
}

/// A scheme-2 row's `tenant_tag`: `hex(sha256({"seq":..,"tenant":..}))`. A bundle filtered to
/// one tenant recomputes it for its tenant at each hidden event's `seq`, so none of its events
/// can pass as another tenant's; `seq` makes tags of one tenant differ, so they cannot be grouped
/// without guessing the tenant's name.
pub fn tenant_tag(seq: i64, tenant: Option<&str>) -> String {
    let json = json!({"seq": seq, "tenant": tenant});
    hex::encode(Sha256::digest(json.to_string().as_bytes()))
}

/// A scheme-2 row's `hash` from its parts, without its content.
pub fn link_parts(prev_hash: &str, stamp: &str, tenant_tag: &str, content_hash: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(prev_hash.as_bytes());
    hasher.update(stamp.as_bytes());
    hasher.update(tenant_tag.as_bytes());
    hasher.update(content_hash.as_bytes());
    hex::encode(hasher.finalize())
}

fn sha256_hex(prev_hash: &str, bytes: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(prev_hash.as_bytes());
    hasher.update(bytes);
    hex::encode(hasher.finalize())
}

/// Appends `event` inside `tx`; the caller commits. Returns the new event's id.
pub async fn append(
    tx: &mut Transaction<'_, Postgres>,
    event: &NewEvent,
) -> Result<String, sqlx::Error> {
    let mut ids = append_many(tx, &[event]).await?;
    ids.pop().ok_or(sqlx::Error::RowNotFound)
}

/// The last link of the chain: its `seq` and `hash`.
pub type Head = (i64, String);

/// `BEGIN` and the chain lock in one round trip (`Pool::begin_with`): the transaction starts
/// holding the lock, and the next statement's snapshot sees every committed append.
pub fn begin_locked() -> String {
    format!("BEGIN; SELECT pg_advisory_xact_lock({CHAIN_LOCK})")
}

/// Appends `events`, in order, inside `tx` under one hold of the chain lock, with one
/// statement; the caller commits. Returns the new events' ids, in order.
pub async fn append_many(
    tx: &mut Transaction<'_, Postgres>,
    events: &[&NewEvent],
) -> Result<Vec<String>, sqlx::Error> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    // The lock is taken in its own statement: a statement's snapshot is taken when it starts,
    // so the head must be read by a later statement than the one that waited for the lock.
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(CHAIN_LOCK)
        .execute(&mut **tx)
        .await?;
    let head = read_head(tx).await?;
    Ok(append_after(tx, events, head).await?.0)
}

/// The chain's last link as committed (read under the lock: nobody can add one meanwhile).
pub async fn read_head(tx: &mut Transaction<'_, Postgres>) -> Result<Option<Head>, sqlx::Error> {
    sqlx::query_as("SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1")
        .fetch_optional(&mut **tx)
        .await
}

/// Appends `events` after `head` inside `tx`, whose transaction holds the chain lock. A `head`
/// that is not the chain's last link (another writer appended since it was read) makes the
/// insert fail on `seq` (the chain is gapless, so the next `seq` exists): [`stale_head`].
/// Returns the ids and the new head.
pub async fn append_after(
    tx: &mut Transaction<'_, Postgres>,
    events: &[&NewEvent],
    head: Option<Head>,
) -> Result<(Vec<String>, Head), sqlx::Error> {
    let (columns, last) = chained(events, head);
    columns.insert(tx, None).await?;
    Ok((columns.id, last))
}

/// Appends `events` after `head` with one statement that takes the chain lock itself, so that
/// on `conn` outside a transaction the lock, the insert and the commit are one round trip (and
/// inside one, the lock is held only from this statement on). The statement's snapshot may
/// predate the lock, which is why `head` is never read here: a `head` that is not the last
/// link fails on `seq` as in [`append_after`] ([`stale_head`]). Returns the ids and new head.
pub async fn append_locked(
    conn: &mut sqlx::PgConnection,
    events: &[&NewEvent],
    head: Option<Head>,
) -> Result<(Vec<String>, Head), sqlx::Error> {
    let (columns, last) = chained(events, head);
    columns.insert(conn, Some(CHAIN_LOCK)).await?;
    Ok((columns.id, last))
}

/// `events` as chained rows after `head`: ids, times and hashes assigned, in order.
fn chained(events: &[&NewEvent], head: Option<Head>) -> (Columns, Head) {
    let (mut seq, mut prev_hash) = match head {
        Some((seq, hash)) => (seq + 1, hash),
        None => (1, GENESIS.to_owned()),
    };
    let mut columns = Columns::default();
    for event in events {
        let id = crate::ids::new("ev");
        let at = crate::ids::now_micros();
        let hash = hash(SCHEME, &prev_hash, &event.row(seq, &id, &at));
        columns.push(
            event,
            seq,
            id,
            at,
            std::mem::replace(&mut prev_hash, hash.clone()),
            hash,
        );
        seq += 1;
    }
    (columns, (seq - 1, prev_hash))
}

/// The insert failed because the head it chained to was not the last link any more.
pub fn stale_head(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db)
        if db.constraint() == Some("audit_events_pkey"))
}

/// The columns of `audit_events`, in the order [`Columns`] binds them: the one list.
macro_rules! event_columns {
    () => {
        "seq, id, at, kind, execution_id, key_id, tenant, decision_id, allow, reasons, input, \
         decision, policy_revision, prev_hash, hash, hash_version"
    };
}
/// The columns of a whole stored row (`audit::verify::StoredEvent`), for `SELECT`s.
pub const EVENT_COLUMNS: &str = event_columns!();
macro_rules! insert_columns {
    () => {
        concat!(
            "INSERT INTO audit_events (",
            event_columns!(),
            ") SELECT e.* FROM "
        )
    };
}
/// The rows, one array per column.
macro_rules! unnest_rows {
    () => {
        "unnest($1::bigint[], $2::text[], $3::timestamptz[], $4::text[], $5::text[], $6::text[], \
         $7::text[], $8::text[], $9::boolean[], $10::jsonb[], $11::jsonb[], $12::jsonb[], \
         $13::text[], $14::text[], $15::text[], $16::smallint[]) AS e"
    };
}
/// Inserts rows chained after a head read under the lock the transaction holds.
const INSERT: &str = concat!(insert_columns!(), unnest_rows!());
/// Takes the chain lock (`$17`) before producing any row: the one-statement append.
const INSERT_LOCKED: &str = concat!(
    "WITH chain_lock AS MATERIALIZED (SELECT pg_advisory_xact_lock($17)) ",
    insert_columns!(),
    "chain_lock, ",
    unnest_rows!()
);

/// A batch of chained rows as one array per column, for one `INSERT ... SELECT unnest(...)`.
#[derive(Default)]
struct Columns {
    seq: Vec<i64>,
    id: Vec<String>,
    at: Vec<DateTime<Utc>>,
    kind: Vec<&'static str>,
    execution_id: Vec<Option<String>>,
    key_id: Vec<Option<String>>,
    tenant: Vec<Option<String>>,
    decision_id: Vec<Option<String>>,
    allow: Vec<Option<bool>>,
    reasons: Vec<Value>,
    input: Vec<Value>,
    decision: Vec<Value>,
    policy_revision: Vec<Option<String>>,
    prev_hash: Vec<String>,
    hash: Vec<String>,
    hash_version: Vec<i16>,
}

impl Columns {
    fn push(
        &mut self,
        event: &NewEvent,
        seq: i64,
        id: String,
        at: DateTime<Utc>,
        prev_hash: String,
        hash: String,
    ) {
        self.seq.push(seq);
        self.id.push(id);
        self.at.push(at);
        self.kind.push(event.kind.as_str());
        self.execution_id.push(event.execution_id.clone());
        self.key_id.push(event.key_id.clone());
        self.tenant.push(event.tenant.clone());
        self.decision_id.push(event.decision_id.clone());
        self.allow.push(event.allow);
        self.reasons.push(event.reasons.clone());
        self.input.push(event.input.clone());
        self.decision.push(event.decision.clone());
        self.policy_revision.push(event.policy_revision.clone());
        self.prev_hash.push(prev_hash);
        self.hash.push(hash);
        self.hash_version.push(SCHEME.into());
    }

    /// One `INSERT`; with `lock`, the statement first takes that advisory lock (held to the end
    /// of its transaction) and only then produces the rows it inserts.
    async fn insert(
        &self,
        conn: &mut sqlx::PgConnection,
        lock: Option<i64>,
    ) -> Result<(), sqlx::Error> {
        let sql = match lock {
            Some(_) => INSERT_LOCKED,
            None => INSERT,
        };
        let query = sqlx::query(sql)
            .bind(&self.seq)
            .bind(&self.id)
            .bind(&self.at)
            .bind(&self.kind)
            .bind(&self.execution_id)
            .bind(&self.key_id)
            .bind(&self.tenant)
            .bind(&self.decision_id)
            .bind(&self.allow)
            .bind(&self.reasons)
            .bind(&self.input)
            .bind(&self.decision)
            .bind(&self.policy_revision)
            .bind(&self.prev_hash)
            .bind(&self.hash)
            .bind(&self.hash_version);
        let query = match lock {
            Some(key) => query.bind(key),
            None => query,
        };
        query.execute(conn).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> NewEvent {
        NewEvent {
            kind: api_types::EventKind::ExecutionDecision,
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

    fn at() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-30T00:00:00.123456Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn canonical_form_sorts_keys_and_changes_with_content() {
        let at = at();
        let event = event();
        let bytes = String::from_utf8(canonical(&event.row(1, "ev_1", &at))).unwrap();
        assert!(bytes.contains(r#""input":{"a":2,"b":1}"#), "{bytes}");
        assert!(bytes.contains("2026-11-30T00:00:00.123456Z"), "{bytes}");
        let mut denied = event.clone();
        denied.allow = Some(false);
        for scheme in [HashScheme::Whole, HashScheme::Content] {
            let a = hash(scheme, GENESIS, &event.row(1, "ev_1", &at));
            let b = hash(scheme, GENESIS, &denied.row(1, "ev_1", &at));
            assert_ne!(a, b);
            assert_eq!(a.len(), 64);
        }
    }

    /// Known answers, computed apart from this code (Python's hashlib): scheme 1 is what every
    /// event before scheme 2 was hashed with, and must never change.
    #[test]
    fn both_schemes_hash_as_documented() {
        let at = at();
        let event = event();
        let row = event.row(1, "ev_1", &at);
        assert_eq!(
            String::from_utf8(canonical(&row)).unwrap(),
            r#"{"allow":true,"at":"2026-11-30T00:00:00.123456Z","decision":{"allow":true},"decision_id":"dc_1","execution_id":"ex_1","id":"ev_1","input":{"a":2,"b":1},"key_id":"key_1","kind":"execution.decision","policy_revision":"sha256:00","reasons":[],"seq":1,"tenant":"acme"}"#
        );
        assert_eq!(
            hash(HashScheme::Whole, GENESIS, &row),
            "47535a456024d029419cce5d8d2ae6db8b7b98ea53f6ec3affd55c11e9864ce8"
        );
        let content = content_hash(&row);
        assert_eq!(
            content,
            "5e9e7977270c0ac113a8ac7235dba8d5d417d6ac79e513c3b4d9be5ed0650ffb"
        );
        let tag = tenant_tag(1, Some("acme"));
        assert_eq!(
            tag,
            "fba78aeaba1ed2ff8a9ff28be5a54a2f9cb05d7f8ffdd609f5a0b1c71ed80ac8"
        );
        assert_eq!(
            tenant_tag(1, None),
            "7f1712bf0eb76b9d66f421dd7a1503b58bdd1ea4c73f9fc247877f2ba7ce64df"
        );
        let stamped = stamp(1, &at);
        assert_eq!(
            stamped,
            "c8fd2fb1107e8cd8e34069d41b9ac6ebb204c60642ed1f218e6c797bf56598ce"
        );
        let linked = "474016e8b173eef9459b59bc092f575b20df7e2a0fe0b1397d9ec0dabc78f014";
        assert_eq!(hash(HashScheme::Content, GENESIS, &row), linked);
        assert_eq!(link_parts(GENESIS, &stamped, &tag, &content), linked);
    }

    #[test]
    fn schemes_round_trip_and_unknown_ones_are_refused() {
        for scheme in [HashScheme::Whole, HashScheme::Content] {
            let text = serde_json::to_string(&scheme).unwrap();
            assert_eq!(serde_json::from_str::<HashScheme>(&text).unwrap(), scheme);
        }
        assert_eq!(serde_json::to_string(&HashScheme::Content).unwrap(), "2");
        assert!(serde_json::from_str::<HashScheme>("3").is_err());
    }
}
