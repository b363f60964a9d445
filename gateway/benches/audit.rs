//! Audit write capacity (DESIGN.md sections 8 and 13), measured against baselines in the same
//! run, on a private PostgreSQL (no Docker needed). Measured, not asserted, except that a gap
//! or a broken link in the chain afterwards makes the run exit non-zero.
//!
//! 1. Group commit against binary `COPY`: `AuditStore::record_event` (durable, chained,
//!    group-committed) with 8 concurrent writers, against one binary `COPY` of as many rows of
//!    the same shape (chained and encoded in the timed part) into a table of the same shape.
//!    Target: >= 0.3x.
//! 2. A single writer's latency: `record_event` one at a time (its batch is itself) against
//!    the way every append was written before group commit (one transaction each: lock, head,
//!    insert, commit), alternating runs. Target: not worse.
//! 3. The chain lock under two replicas: 8 writers on one store (one replica) against 4 writers
//!    on each of two stores with their own pools and writer tasks (two replicas taking turns
//!    on the one chain lock). What two replicas lose to the lock, and how many rows each lock
//!    hold carried.
//!
//! `make bench`, or `cargo bench -p gateway --bench audit` as root (the system's PostgreSQL
//! binaries). `SANDGATE_BENCH_AUDIT_ROWS` changes the rows per series (default 4000),
//! `SANDGATE_BENCH_AUDIT_ROUNDS` the rounds of target 1 (default 3; the medians are reported).
//! Before target 2 it prints where a batch's time goes: a round trip, one durable commit (the
//! WAL flush every batch waits for) and the batches of 8 writers.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark, not gateway code: a panic is a failed run"
)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use serde_json::{json, Value};
use sqlx::postgres::PgPoolCopyExt;
use sqlx::PgPool;

use gateway::audit::chain::{self, NewEvent, Row, GENESIS};
use gateway::audit::AuditStore;
use gateway::config::Config;
use gateway::database::EmbeddedPostgres;

mod common;
use common::{env_usize, ms, private_postgres, workspace_root, Series, DATABASE};

/// Scratch table for the COPY baseline.
const COPY_TABLE: &str = "bench_copy";
/// Scratch table for the cost of one durable commit.
const FLUSH_TABLE: &str = "bench_flush";
const WRITERS: usize = 8;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let root = tempfile::Builder::new()
        .prefix("sgbench")
        .tempdir()
        .unwrap();
    let passed = runtime.block_on(async {
        let (pg, url) = private_postgres(root.path()).await;
        let passed = run(&pg.0, &url, &root.path().join("gateway")).await;
        drop(pg);
        passed
    });
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn run(pg: &EmbeddedPostgres, url: &str, data_dir: &Path) -> bool {
    // Migrations and roles, through the gateway's own opening of the database; then two
    // pools as two replicas would have them.
    let one = gateway::database::Database::open(&config(url, data_dir))
        .await
        .unwrap();
    let two = gateway::database::Database::open(&config(url, data_dir))
        .await
        .unwrap();
    let (store, other) = (
        AuditStore::new(one.pool.clone()),
        AuditStore::new(two.pool.clone()),
    );
    let rows = env_usize("SANDGATE_BENCH_AUDIT_ROWS", 4000).max(WRITERS * 2);
    let template = sample_event();
    // The COPY baseline needs a scratch table, which the gateway's own role may not create.
    let owner = PgPool::connect_with(pg.connect_options(DATABASE))
        .await
        .unwrap();
    sqlx::query(&format!(
        "CREATE TABLE {COPY_TABLE} (LIKE audit_events INCLUDING ALL)"
    ))
    .execute(&owner)
    .await
    .unwrap();

    print_header(&owner, &template, rows).await;
    let rounds = env_usize("SANDGATE_BENCH_AUDIT_ROUNDS", 3).max(1);
    let copy = group_against_copy(&store, &owner, &template, rows, rounds).await;
    where_a_batch_goes(&store, &owner, &template, rows, copy).await;
    single_writer_latency(&store, &one.pool, &template, rows / 4).await;
    two_replicas(&store, &other, &template, rows).await;
    let verified = store.verify_chain().await.unwrap();
    println!(
        "  chain after every series ({} appended by two stores): {}",
        verified.summary(),
        if verified.ok() { "verifies" } else { "BROKEN" }
    );
    owner.close().await;
    one.close().await;
    two.close().await;
    verified.ok()
}

async fn print_header(owner: &PgPool, template: &NewEvent, rows: usize) {
    let setting = |name: &'static str| async move {
        sqlx::query_scalar::<_, String>(&format!("SHOW {name}"))
            .fetch_one(owner)
            .await
            .unwrap()
    };
    println!(
        "audit writes, {rows} rows of {} bytes of JSON (fsync {}, synchronous_commit {})",
        template.input.to_string().len() + template.decision.to_string().len(),
        setting("fsync").await,
        setting("synchronous_commit").await
    );
}

/// Target 1: 8 concurrent writers through group commit against binary COPY, in `rounds`
/// rounds (COPY, 8 writers, 32 writers each), so that each ratio compares series run next to
/// each other on a shared machine; the medians are the result. Returns COPY's median rate.
async fn group_against_copy(
    store: &AuditStore,
    owner: &PgPool,
    template: &NewEvent,
    rows: usize,
    rounds: usize,
) -> f64 {
    let (mut copies, mut eight, mut many, mut per_commit) = (vec![], vec![], vec![], vec![]);
    for round in 1..=rounds {
        sqlx::query(&format!("TRUNCATE {COPY_TABLE}"))
            .execute(owner)
            .await
            .unwrap();
        let started = Instant::now();
        let copied = copy_binary(owner, template, rows).await;
        let copy = copied as f64 / started.elapsed().as_secs_f64();
        assert_eq!(copied, rows as u64);
        let concurrent = concurrent_rate(&[store], WRITERS, template, rows).await;
        // Each writer waits for its commit, so a batch holds at most one write per writer and
        // the rate is bounded by writers / flush time; more writers show what batching carries.
        let before = store.batches_committed();
        let wide = concurrent_rate(&[store], WRITERS * 4, template, rows).await;
        let commits = (store.batches_committed() - before).max(1);
        println!(
            "  round {round}: COPY {copy:>6.0} rows/s; {WRITERS} writers {concurrent:>5.0} rows/s {:.3}x; {} writers {wide:>5.0} rows/s {:.3}x, {:.1} rows per commit",
            concurrent / copy,
            WRITERS * 4,
            wide / copy,
            rows as f64 / commits as f64
        );
        copies.push(copy);
        eight.push(concurrent / copy);
        many.push(wide / copy);
        per_commit.push(rows as f64 / commits as f64);
    }
    let copy = Series::new(copies).percentile(50);
    println!("  binary COPY, one transaction               {copy:>9.0} rows/s (median)");
    println!(
        "  record_event, {WRITERS} writers, group commit      {:.3}x COPY (median of {rounds}; target >= 0.3)",
        Series::new(eight).percentile(50)
    );
    println!(
        "  record_event, {} writers, group commit     {:.3}x COPY (median)  {:.1} rows per commit",
        WRITERS * 4,
        Series::new(many).percentile(50),
        Series::new(per_commit).percentile(50)
    );
    copy
}

/// Where one batch's time goes: a round trip, a durable commit (the WAL flush), and what a
/// batch of the 8 writers costs; with each writer waiting for its own commit, a batch holds at
/// most 8 rows, so 8 rows per durable commit is the ceiling of the 8-writer rate.
async fn where_a_batch_goes(
    store: &AuditStore,
    pool: &PgPool,
    template: &NewEvent,
    rows: usize,
    copy: f64,
) {
    let samples = (rows / 8).clamp(50, 500);
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query(&format!("CREATE TABLE {FLUSH_TABLE} (n int)"))
        .execute(&mut *conn)
        .await
        .unwrap();
    let (mut trip, mut flush) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let started = Instant::now();
        sqlx::query("SELECT 1").execute(&mut *conn).await.unwrap();
        trip.push(ms(started.elapsed()));
        // The smallest durable commit: one tiny row, its commit record flushed.
        let started = Instant::now();
        sqlx::query(&format!("INSERT INTO {FLUSH_TABLE} VALUES (1)"))
            .execute(&mut *conn)
            .await
            .unwrap();
        flush.push(ms(started.elapsed()));
    }
    drop(conn);
    let (trip, flush) = (Series::new(trip), Series::new(flush));
    let before = store.batches_committed();
    let started = Instant::now();
    let rate = concurrent_rate(&[store], WRITERS, template, rows).await;
    let batches = (store.batches_committed() - before).max(1) as f64;
    let per_batch = ms(started.elapsed()) / batches;
    let ceiling = WRITERS as f64 / (flush.percentile(50) / 1e3);
    println!("  where a batch goes (8 writers, {rows} rows):");
    println!(
        "    round trip (SELECT 1)                     {}",
        trip.line()
    );
    println!(
        "    durable one-row commit (WAL flush)       {}",
        flush.line()
    );
    println!(
        "    batch: {per_batch:.2} ms, {:.1} rows, {rate:.0} rows/s; 8 rows per p50 flush would be {ceiling:.0} rows/s = {:.3}x COPY",
        rows as f64 / batches,
        ceiling / copy
    );
}

/// Target 2: one writer, group commit against one transaction per append (alternating).
async fn single_writer_latency(
    store: &AuditStore,
    pool: &PgPool,
    template: &NewEvent,
    runs: usize,
) {
    let (mut group, mut each) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let started = Instant::now();
        store.record_event(template).await.unwrap();
        group.push(ms(started.elapsed()));
        let started = Instant::now();
        one_transaction(pool, template).await;
        each.push(ms(started.elapsed()));
    }
    let (group, each) = (Series::new(group), Series::new(each));
    println!(
        "  one writer, one transaction per append      {}",
        each.line()
    );
    println!(
        "  one writer, group commit                    {}  p50 {:.2}x (target <= 1.0)",
        group.line(),
        group.percentile(50) / each.percentile(50)
    );
}

/// Target 3: the chain lock shared by two replicas.
async fn two_replicas(store: &AuditStore, other: &AuditStore, template: &NewEvent, rows: usize) {
    let holds = || store.batches_committed() + other.batches_committed();
    let before = holds();
    let one = concurrent_rate(&[store], WRITERS, template, rows).await;
    let middle = holds();
    let two = concurrent_rate(&[store, other], WRITERS / 2, template, rows).await;
    let after = holds();
    let per_hold = |commits: u64| rows as f64 / commits.max(1) as f64;
    println!(
        "  one replica, {WRITERS} writers                      {one:>9.0} rows/s  {:.1} rows per lock hold",
        per_hold(middle - before)
    );
    println!(
        "  two replicas, {} writers each               {two:>9.0} rows/s  {:.1} rows per lock hold  {:.2}x one replica",
        WRITERS / 2,
        per_hold(after - middle),
        two / one
    );
}

/// Rows per second appended by `writers` tasks on each of `stores`, `rows` in all.
async fn concurrent_rate(
    stores: &[&AuditStore],
    writers: usize,
    event: &NewEvent,
    rows: usize,
) -> f64 {
    let tasks_total = writers * stores.len();
    let each = rows / tasks_total;
    let started = Instant::now();
    let tasks: Vec<_> = stores
        .iter()
        .flat_map(|store| (0..writers).map(move |_| (*store).clone()))
        .map(|store| {
            let event = event.clone();
            tokio::spawn(async move {
                for _ in 0..each {
                    store.record_event(&event).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (each * tasks_total) as f64 / started.elapsed().as_secs_f64()
}

/// One append as every append was written before group commit.
async fn one_transaction(pool: &PgPool, event: &NewEvent) {
    let mut tx = pool.begin().await.unwrap();
    chain::append(&mut tx, event).await.unwrap();
    tx.commit().await.unwrap();
}

/// An execution decision of the usual size.
fn sample_event() -> NewEvent {
    let input = json!({
        "principal": {"key_id": "key_0123456789abcdef", "tenant": "acme", "role": "agent"},
        "request": {"language": "python", "code_sha256": "5".repeat(64), "code_bytes": 8,
                    "files": [{"path": "data.csv", "bytes": 1200}], "network": [],
                    "mounts": [], "limits": {"timeout_ms": 5000}, "labels": {"agent": "a7"},
                    "kind": "execution"},
        "environment": {"backends": ["gvisor"], "datasets": [], "now": "2026-12-02T00:00:00Z"},
    });
    let decision = json!({
        "allow": true, "require_approval": false, "reasons": [], "backend": "gvisor",
        "network": {"allow": [], "max_connections": 32, "max_bytes": 104857600},
        "mounts": [],
        "limits": {"timeout_ms": 5000, "memory_mb": 256, "cpus": 1.0, "pids": 128,
                   "disk_mb": 256, "output_bytes": 1048576},
    });
    NewEvent {
        // A real kind: events name an `EventKind` (the bench writes to its own database).
        kind: api_types::EventKind::ExecutionDecision,
        execution_id: Some("ex_0123456789abcdef0123456789abcdef".into()),
        key_id: Some("key_0123456789abcdef".into()),
        tenant: Some("acme".to_owned()),
        decision_id: Some("dc_0123456789abcdef0123456789abcdef".into()),
        allow: Some(true),
        reasons: json!([]),
        input,
        decision,
        policy_revision: Some(format!("sha256:{}", "a".repeat(64))),
    }
}

fn config(url: &str, data_dir: &Path) -> Config {
    Config {
        database_url: Some(url.to_owned()),
        data_dir: data_dir.to_owned(),
        policy_dir: workspace_root().join("policies"),
        sandbox_init: Some(PathBuf::from("/nonexistent/sandbox-init")),
        ..Config::default()
    }
}

/// Chains `rows` copies of `event` and writes them with one binary COPY; returns rows copied.
async fn copy_binary(pool: &PgPool, event: &NewEvent, rows: usize) -> u64 {
    let mut buf = Vec::with_capacity(rows * 1024);
    buf.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
    buf.extend_from_slice(&0i32.to_be_bytes()); // flags
    buf.extend_from_slice(&0i32.to_be_bytes()); // header extension
    let mut prev = GENESIS.to_owned();
    for seq in 1..=rows as i64 {
        let id = gateway::ids::new("ev");
        let at = gateway::ids::now_micros();
        let row = Row {
            seq,
            id: &id,
            at: &at,
            kind: event.kind.as_str(),
            execution_id: event.execution_id.as_deref(),
            key_id: event.key_id.as_deref(),
            tenant: event.tenant.as_deref(),
            decision_id: event.decision_id.as_deref(),
            allow: event.allow,
            reasons: &event.reasons,
            input: &event.input,
            decision: &event.decision,
            policy_revision: event.policy_revision.as_deref(),
        };
        let hash = chain::hash(chain::SCHEME, &prev, &row);
        encode_row(&mut buf, &row, &prev, &hash);
        prev = hash;
    }
    buf.extend_from_slice(&(-1i16).to_be_bytes());
    let mut copy = pool
        .copy_in_raw(&format!("COPY {COPY_TABLE} FROM STDIN (FORMAT binary)"))
        .await
        .unwrap();
    copy.send(buf).await.unwrap();
    copy.finish().await.unwrap()
}

/// One tuple in PostgreSQL's binary COPY format, columns in `audit_events` order.
fn encode_row(buf: &mut Vec<u8>, row: &Row<'_>, prev_hash: &str, hash: &str) {
    fn field(buf: &mut Vec<u8>, bytes: Option<&[u8]>) {
        match bytes {
            Some(bytes) => {
                buf.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
                buf.extend_from_slice(bytes);
            }
            None => buf.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    fn jsonb(value: &Value) -> Vec<u8> {
        let mut bytes = vec![1u8]; // jsonb binary format version
        bytes.extend_from_slice(value.to_string().as_bytes());
        bytes
    }
    // timestamptz: microseconds since 2000-01-01 UTC.
    const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;
    let at = row.at.timestamp_micros() - PG_EPOCH_OFFSET_US;
    buf.extend_from_slice(&16i16.to_be_bytes());
    field(buf, Some(&row.seq.to_be_bytes()));
    field(buf, Some(row.id.as_bytes()));
    field(buf, Some(&at.to_be_bytes()));
    field(buf, Some(row.kind.as_bytes()));
    field(buf, row.execution_id.map(str::as_bytes));
    field(buf, row.key_id.map(str::as_bytes));
    field(buf, row.tenant.map(str::as_bytes));
    field(buf, row.decision_id.map(str::as_bytes));
    field(
        buf,
        row.allow
            .map(|allow| [u8::from(allow)])
            .as_ref()
            .map(|b| &b[..]),
    );
    field(buf, Some(&jsonb(row.reasons)));
    field(buf, Some(&jsonb(row.input)));
    field(buf, Some(&jsonb(row.decision)));
    field(buf, row.policy_revision.map(str::as_bytes));
    field(buf, Some(prev_hash.as_bytes()));
    field(buf, Some(hash.as_bytes()));
    field(buf, Some(&i16::from(chain::SCHEME).to_be_bytes()));
}
