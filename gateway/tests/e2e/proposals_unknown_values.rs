//! A stored proposal whose `origin` or `status` is outside its closed set (a newer version, or a
//! hand edit, could leave it): the row is not read as any other value. The API answers 500
//! `internal` for it, and `sandgate_store_unknown_values_total{column}` counts each refusal,
//! the one rule of `audit::unknown_value` (as for executions, sessions, approvals and keys).

use crate::common;
use crate::unknown_values::{counted as unknown_values, store, widen};

use common::TestGateway;

/// Refused as the one rule says, neither unknown value shown as a value.
async fn refused(gw: &TestGateway, reviewer: &str, path: &str) {
    crate::unknown_values::refused(gw, reviewer, path, &["operator", "withdrawn"]).await;
}

/// Stores a proposal as the gateway would (every column within its set).
async fn stored_proposal(pool: &sqlx::PgPool, id: &str) {
    sqlx::query(
        "INSERT INTO policy_proposals (id, title, rationale, author_key_id, author_principal, \
         author_tenant, origin, patch, base_revision, candidate_revision, evidence, \
         tests_passed) VALUES ($1, 'Allow lab', '', 'key_x', 'ana', 'ops', 'reviewer', \
         '{}'::jsonb, 'sha256:aa', 'sha256:bb', '{}'::jsonb, true)",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_stored_proposal_origins_and_statuses_fail_closed_and_are_counted() {
    let gw = TestGateway::start().await;
    let admin = gw.key("admin", "ops").await;
    let reviewer = gw.key("reviewer", "ops").await;
    let pool = gw.pool().await;
    stored_proposal(&pool, "pp_known").await;
    let (status, body) = gw.get(&reviewer, "/v1/policy/proposals/pp_known").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["origin"], "reviewer", "{body}");
    assert_eq!(
        unknown_values(&gw, &admin, "policy_proposals.origin").await,
        0.0
    );

    widen(&pool, "policy_proposals", "policy_proposals_origin_check").await;
    widen(&pool, "policy_proposals", "policy_proposals_status_check").await;
    store(&pool, "policy_proposals", "origin", "pp_known", "operator").await;
    refused(&gw, &reviewer, "/v1/policy/proposals/pp_known").await;
    refused(&gw, &reviewer, "/v1/policy/proposals").await;
    assert_eq!(
        unknown_values(&gw, &admin, "policy_proposals.origin").await,
        2.0
    );

    stored_proposal(&pool, "pp_later").await;
    store(&pool, "policy_proposals", "status", "pp_later", "withdrawn").await;
    refused(&gw, &reviewer, "/v1/policy/proposals/pp_later").await;
    assert_eq!(
        unknown_values(&gw, &admin, "policy_proposals.status").await,
        1.0
    );
    gw.stop().await;
}
