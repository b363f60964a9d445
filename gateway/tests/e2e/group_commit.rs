//! Group commit (DESIGN 13) against the real PostgreSQL: concurrent writers share
//! transactions and keep one gapless chain; a batch that does not commit fails every caller in
//! it and stores none of their rows; one write the database refuses for its content fails alone.

use crate::common;

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::json;

use gateway::audit::chain::{NewEvent, CHAIN_LOCK};
use gateway::audit::{AuditError, AuditStore};

/// An event marked `label` (in its input: events name an `api_types::EventKind`).
fn event(label: &'static str, n: usize) -> NewEvent {
    NewEvent {
        kind: api_types::EventKind::ExecutionDecision,
        execution_id: None,
        key_id: None,
        tenant: Some("acme".into()),
        decision_id: None,
        allow: Some(true),
        reasons: json!([]),
        input: json!({"n": n, "label": label}),
        decision: json!({}),
        policy_revision: None,
    }
}

/// The app's store (as `sandgate_app`, migrated) and an owner pool on a fresh database.
async fn stores() -> (AuditStore, sqlx::PgPool, gateway::database::Database) {
    let url = common::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let db = gateway::database::Database::open(&common::test_config(Some(url.clone()), dir.path()))
        .await
        .unwrap();
    let owner = sqlx::PgPool::connect(&url).await.unwrap();
    (AuditStore::new(db.pool.clone()), owner, db)
}

/// Waits until the writer's first batch is blocked on the chain lock the test holds.
async fn writer_waits_for_the_lock(owner: &sqlx::PgPool) {
    common::eventually(
        Duration::from_secs(30),
        "the writer waits for the chain lock",
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .fetch_one(owner)
            .await
            .unwrap();
            waiting == 1
        },
    )
    .await;
}

/// Waits until `n` writes are queued behind the held batch (so they form the next one).
async fn queued_behind(store: &AuditStore, n: usize) {
    common::eventually(Duration::from_secs(30), "the writes are queued", || async {
        store.writes_queued() == n
    })
    .await;
}

async fn events_of(owner: &sqlx::PgPool, label: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE input->>'label' = $1")
        .bind(label)
        .fetch_one(owner)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_writers_share_transactions_and_keep_one_gapless_chain() {
    let (store, owner, db) = stores().await;
    let writes = (0..200).map(|n| {
        let store = store.clone();
        async move { store.record_event(&event("test.many", n)).await }
    });
    let ids: Vec<String> = join_all(writes)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(ids.len(), 200);
    assert_eq!(events_of(&owner, "test.many").await, 200);
    assert!(
        store.batches_committed() < 200,
        "200 concurrent writes took {} transactions: nothing was grouped",
        store.batches_committed()
    );
    let verified = store.verify_chain().await.unwrap();
    assert!(verified.ok(), "{}", verified.summary());
    owner.close().await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_that_does_not_commit_fails_every_caller_in_it_and_stores_nothing_of_theirs() {
    let (store, owner, db) = stores().await;
    // A check that only fails at COMMIT (a deferred constraint trigger): the whole batch holding
    // a `test.poison` event fails at its commit.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF NEW.input->>'label' = 'test.poison' THEN RAISE EXCEPTION 'poisoned batch'; END IF; \
           RETURN NEW; END $$; \
         CREATE CONSTRAINT TRIGGER poison AFTER INSERT ON audit_events \
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_poison();",
    )
    .execute(&owner)
    .await
    .unwrap();
    // Hold the chain lock, so the writer waits inside its first batch while the rest queue.
    let mut holder = owner.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(CHAIN_LOCK)
        .execute(&mut *holder)
        .await
        .unwrap();
    let first = {
        let store = store.clone();
        tokio::spawn(async move { store.record_event(&event("test.first", 0)).await })
    };
    writer_waits_for_the_lock(&owner).await;
    let queued: Vec<_> = (0..10)
        .map(|n| {
            let store = store.clone();
            let kind = if n == 5 {
                "test.poison"
            } else {
                "test.bystander"
            };
            tokio::spawn(async move { store.record_event(&event(kind, n)).await })
        })
        .collect();
    queued_behind(&store, 10).await;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(CHAIN_LOCK)
        .execute(&mut *holder)
        .await
        .unwrap();
    drop(holder);

    first.await.unwrap().unwrap();
    for caller in queued {
        let result = caller.await.unwrap();
        assert!(
            matches!(result, Err(AuditError::Batch(_))),
            "a caller in the failed batch was answered {result:?}"
        );
    }
    assert_eq!(events_of(&owner, "test.first").await, 1);
    assert_eq!(
        events_of(&owner, "test.bystander").await,
        0,
        "a failed batch left rows"
    );
    assert_eq!(events_of(&owner, "test.poison").await, 0);
    // The writer goes on: the next write commits and the chain is whole.
    store.record_event(&event("test.after", 0)).await.unwrap();
    let verified = store.verify_chain().await.unwrap();
    assert!(verified.ok(), "{}", verified.summary());
    owner.close().await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_refused_for_its_content_fails_alone() {
    let (store, owner, db) = stores().await;
    let mut holder = owner.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(CHAIN_LOCK)
        .execute(&mut *holder)
        .await
        .unwrap();
    let first = {
        let store = store.clone();
        tokio::spawn(async move { store.record_event(&event("test.first", 0)).await })
    };
    writer_waits_for_the_lock(&owner).await;
    let queued: Vec<_> = (0..6)
        .map(|n| {
            let store = store.clone();
            let mut event = event("test.neighbour", n);
            if n == 3 {
                // jsonb refuses a NUL character: a data error (22P05) for this write only.
                event.input = json!({"text": "nul \u{0} inside"});
            }
            tokio::spawn(async move { (n, store.record_event(&event).await) })
        })
        .collect();
    queued_behind(&store, 6).await;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(CHAIN_LOCK)
        .execute(&mut *holder)
        .await
        .unwrap();
    drop(holder);
    first.await.unwrap().unwrap();
    for caller in queued {
        let (n, result) = caller.await.unwrap();
        assert_eq!(result.is_ok(), n != 3, "write {n}: {result:?}");
    }
    assert_eq!(events_of(&owner, "test.neighbour").await, 5);
    let verified = store.verify_chain().await.unwrap();
    assert!(verified.ok(), "{}", verified.summary());
    owner.close().await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_writers_on_one_chain_take_turns_and_each_finds_the_others_appends() {
    let (store, owner, db) = stores().await;
    // A second store is a second writer with its own remembered head, as a replica has.
    let other = AuditStore::new(db.pool.clone());
    for n in 0..5 {
        store.record_event(&event("test.turns", n)).await.unwrap();
        other.record_event(&event("test.turns", n)).await.unwrap();
    }
    let both = (0..40).map(|n| {
        let writer = if n % 2 == 0 {
            store.clone()
        } else {
            other.clone()
        };
        async move { writer.record_event(&event("test.turns", n)).await }
    });
    for result in join_all(both).await {
        result.unwrap();
    }
    assert_eq!(events_of(&owner, "test.turns").await, 50);
    let verified = store.verify_chain().await.unwrap();
    assert!(verified.ok(), "{}", verified.summary());
    owner.close().await;
    db.close().await;
}
