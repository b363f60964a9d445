//! Rows and bytes of audit trail written per 10,000 failed authentications (issue 15 item 5),
//! before and after bounding them, in one run:
//! - **before**: what the gateway used to write: one `auth.failure` event per failure holding
//!   the whole request path, appended through the same `AuditStore::record_event`;
//! - **after**: 10,000 real requests with a wrong key and the same long path, from one client,
//!   through an in-process gateway (HTTP on loopback): one event per window and source, the
//!   rest counted into a summary, 429 past the rate.
//!
//! Prints rows, bytes (the rows' on-disk size, `pg_column_size`, which TOAST compresses, and
//! the inputs' JSON text) and the ratio of on-disk bytes. Fails if the
//! bounded run writes more than 10 rows or more than 1% of the bytes of the baseline.
//! `SANDGATE_BENCH_BAD_REQUESTS` changes the count. Run by `make bench`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a panic is a failure report

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::PgPool;

use gateway::audit::{AuditStore, NewEvent};
use gateway::database::EmbeddedPostgres;

mod common;
use common::{bench_main, config_without_sandboxes, private_cluster, url_of, Gateway};

/// Bytes of the path each bad request carries (the issue saw up to ~64 KiB).
const PATH_BYTES: usize = 16 * 1024;
const CONCURRENCY: usize = 16;

fn main() -> ExitCode {
    bench_main("sgbench", tracing::Level::ERROR, |root| async move {
        let pg = private_cluster(&root);
        run(&pg.0, &root.join("gateway")).await
    })
}

async fn run(pg: &EmbeddedPostgres, data_dir: &Path) -> bool {
    let requests: usize = std::env::var("SANDGATE_BENCH_BAD_REQUESTS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(10_000);
    let path = format!("/v1/executions/{}", "a".repeat(PATH_BYTES));

    // Before: the old shape, one whole-path row per failure, in its own database.
    gateway::database::create_database_if_missing(pg, "before")
        .await
        .unwrap();
    let before_url = url_of(pg, "before");
    // Migrations and roles, through the gateway's own opening of the database.
    let opened =
        gateway::database::Database::open(&config_without_sandboxes(&before_url, data_dir))
            .await
            .unwrap();
    let store = AuditStore::new(opened.pool.clone());
    let started = Instant::now();
    for _ in 0..requests {
        store.record_event(&old_failure(&path)).await.unwrap();
    }
    let before_time = started.elapsed();
    let owner = PgPool::connect_with(pg.connect_options("before"))
        .await
        .unwrap();
    let before = written(&owner).await;
    owner.close().await;
    opened.close().await;

    // After: real requests through the gateway.
    gateway::database::create_database_if_missing(pg, "after")
        .await
        .unwrap();
    let no_sandboxes = Path::new("/nonexistent/sandbox-init");
    let gw = Gateway::start(url_of(pg, "after"), data_dir, no_sandboxes, |_| {}).await;
    let started = Instant::now();
    let statuses = send_bad_requests(&gw.url, &path, requests).await;
    let after_time = started.elapsed();
    gw.shutdown.cancel();
    gw.server.await.unwrap().unwrap();
    let owner = PgPool::connect_with(pg.connect_options("after"))
        .await
        .unwrap();
    let after = written(&owner).await;
    owner.close().await;

    report(
        requests,
        before,
        after,
        &statuses,
        [before_time, after_time],
    )
}

fn report(
    requests: usize,
    before: (i64, i64, i64),
    after: (i64, i64, i64),
    statuses: &[(u16, usize)],
    [before_time, after_time]: [Duration; 2],
) -> bool {
    println!("failed authentications: {requests} requests with a {PATH_BYTES}-byte path");
    println!(
        "  before (one whole-path row each): {:>6} rows {:>12} bytes on disk {:>12} bytes of input  ({:.1} s to write)",
        before.0,
        before.1,
        before.2,
        before_time.as_secs_f64()
    );
    println!(
        "  after  (bounded, aggregated):     {:>6} rows {:>12} bytes on disk {:>12} bytes of input  ({:.1} s for the requests)",
        after.0,
        after.1,
        after.2,
        after_time.as_secs_f64()
    );
    println!("  answers: {statuses:?}");
    let ratio = after.1 as f64 / before.1.max(1) as f64;
    println!("  bytes after / before: {ratio:.5}");
    let ok = after.0 <= 10 && ratio <= 0.01;
    if !ok {
        println!("  FAIL: expected at most 10 rows and 1% of the bytes");
    }
    ok
}

/// `auth.failure` as every failure used to be recorded: the whole path in the row.
fn old_failure(path: &str) -> NewEvent {
    NewEvent {
        kind: api_types::EventKind::AuthFailure,
        execution_id: None,
        key_id: None,
        tenant: None,
        decision_id: None,
        allow: Some(false),
        reasons: json!([{"code": "auth.unknown_key", "message": "authentication failed"}]),
        input: json!({"method": "GET", "path": path, "claimed_key_id": null}),
        decision: json!({"allow": false}),
        policy_revision: None,
    }
}

/// Rows, their on-disk bytes (compressed by TOAST) and their inputs' JSON text bytes, of the
/// authentication failure events.
async fn written(pool: &PgPool) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT count(*), COALESCE(sum(pg_column_size(e.*)), 0)::bigint, \
         COALESCE(sum(octet_length(e.input::text)), 0)::bigint FROM audit_events e \
         WHERE kind LIKE 'auth.failure%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Sends `count` requests with a wrong key; returns how many got each status.
async fn send_bad_requests(url: &str, path: &str, count: usize) -> Vec<(u16, usize)> {
    let http = reqwest::Client::new();
    let target = format!("{url}{path}");
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..CONCURRENCY {
        let (http, target) = (http.clone(), target.clone());
        let share = count / CONCURRENCY + usize::from(worker < count % CONCURRENCY);
        tasks.spawn(async move {
            let mut seen = std::collections::BTreeMap::<u16, usize>::new();
            for _ in 0..share {
                let response = http
                    .get(&target)
                    .bearer_auth("sgk_0123456789abcdef_wrong")
                    .send()
                    .await
                    .unwrap();
                *seen.entry(response.status().as_u16()).or_default() += 1;
            }
            seen
        });
    }
    let mut total = std::collections::BTreeMap::<u16, usize>::new();
    while let Some(seen) = tasks.join_next().await {
        for (status, n) in seen.unwrap() {
            *total.entry(status).or_default() += n;
        }
    }
    total.into_iter().collect()
}
