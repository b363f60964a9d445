//! The auditor page's charts (`GET /v1/audit/summary`): the same `v_*` views the Grafana
//! dashboards read, aggregated over a window. Every series is bounded (top N or a fixed number
//! of buckets), so the answer stays small whatever the trail holds.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{AuditError, AuditStore};

/// Most rows of any one series (hosts, reasons, approvals, sessions).
pub const TOP: i64 = 20;

#[derive(Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct OutcomeBucket {
    pub time: DateTime<Utc>,
    /// `allow`, `review` or `deny`.
    pub outcome: String,
    pub decisions: i64,
}

#[derive(Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct ReasonCount {
    pub reason: String,
    pub decisions: i64,
}

#[derive(Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct HostOutcome {
    pub host: String,
    pub outcome: String,
    pub attempts: i64,
}

#[derive(Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Waiting {
    pub id: String,
    pub tenant: Option<String>,
    pub age_seconds: i64,
    pub expires_in_seconds: i64,
}

#[derive(Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct StatusDurations {
    pub status: String,
    pub executions: i64,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub max_ms: Option<i64>,
}

#[derive(Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct OpenSession {
    pub id: String,
    pub tenant: String,
    pub language: String,
    pub status: String,
    pub executions: i64,
    pub age_seconds: i64,
    pub idle_seconds: i64,
}

/// Everything the auditor page draws, for events since `since`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Summary {
    pub since: DateTime<Utc>,
    pub bucket_seconds: i64,
    pub decisions: Vec<OutcomeBucket>,
    pub denials: Vec<ReasonCount>,
    pub egress: Vec<HostOutcome>,
    pub approvals_waiting: Vec<Waiting>,
    pub executions: Vec<StatusDurations>,
    pub sessions_open: Vec<OpenSession>,
}

impl AuditStore {
    pub async fn summary(
        &self,
        since: DateTime<Utc>,
        bucket_seconds: i64,
    ) -> Result<Summary, AuditError> {
        let pool = &self.pool;
        let decisions = sqlx::query_as(
            "SELECT to_timestamp(floor(extract(epoch FROM time) / $2) * $2) AS time, outcome, \
             count(DISTINCT seq) AS decisions FROM v_decisions \
             WHERE time >= $1 AND outcome <> 'none' GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .bind(since)
        .bind(bucket_seconds as f64)
        .fetch_all(pool);
        let denials = sqlx::query_as(
            "SELECT coalesce(reason_code, '(no reason)') AS reason, \
             count(DISTINCT seq) AS decisions FROM v_decisions \
             WHERE time >= $1 AND outcome = 'deny' GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT $2",
        )
        .bind(since)
        .bind(TOP)
        .fetch_all(pool);
        let egress = sqlx::query_as(
            "WITH c AS (SELECT host, outcome, count(*) AS attempts FROM v_egress \
             WHERE time >= $1 GROUP BY 1, 2), \
             top AS (SELECT host FROM c GROUP BY host ORDER BY sum(attempts) DESC, host LIMIT $2) \
             SELECT host, outcome, attempts FROM c WHERE host IN (SELECT host FROM top) \
             ORDER BY host, outcome",
        )
        .bind(since)
        .bind(TOP)
        .fetch_all(pool);
        let (decisions, denials, egress) = tokio::try_join!(decisions, denials, egress)?;
        Ok(Summary {
            since,
            bucket_seconds,
            decisions,
            denials,
            egress,
            approvals_waiting: self.waiting().await?,
            executions: self.status_durations(since).await?,
            sessions_open: self.open_sessions().await?,
        })
    }

    async fn waiting(&self) -> Result<Vec<Waiting>, AuditError> {
        Ok(sqlx::query_as(
            "SELECT id, tenant, age_seconds, expires_in_seconds FROM v_approvals_waiting \
             ORDER BY age_seconds DESC, id LIMIT $1",
        )
        .bind(TOP)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn status_durations(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<StatusDurations>, AuditError> {
        Ok(sqlx::query_as(
            "SELECT status, count(*) AS executions, \
             percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms) AS p50_ms, \
             percentile_cont(0.9) WITHIN GROUP (ORDER BY duration_ms) AS p90_ms, \
             max(duration_ms) AS max_ms FROM v_executions WHERE time >= $1 \
             GROUP BY status ORDER BY status",
        )
        .bind(since)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn open_sessions(&self) -> Result<Vec<OpenSession>, AuditError> {
        Ok(sqlx::query_as(
            "SELECT id, tenant, language, status, executions, age_seconds, idle_seconds \
             FROM v_sessions_open ORDER BY age_seconds DESC, id LIMIT $1",
        )
        .bind(TOP)
        .fetch_all(&self.pool)
        .await?)
    }
}
