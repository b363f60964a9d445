//! Liveness and readiness. `/readyz` names every dependency that is not usable.
//!
//! The answers are typed so the OpenAPI document describes them. Their fields are declared in
//! alphabetical order: the answers were `json!` objects before (serde_json's map sorts its
//! keys), and a struct serialises its fields in declaration order, so the bytes stay the same
//! (the tests below hold that against the `json!` each replaced).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::app::pool::{KeyCount, Refill, Serves};
use crate::app::App;
use crate::audit::replicas::ReplicaRow;

/// `GET /healthz`: the process is up.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Liveness {
    /// Always `ok`.
    pub status: &'static str,
}

/// `GET /readyz`: every dependency checked, and the replicas on this database.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Readiness {
    /// Each dependency by name (`docker`, `runtime:<name>`, `postgres`, `policy`,
    /// `sandbox_init`, `warm_pool`).
    pub checks: BTreeMap<String, Check>,
    /// Labels this gateway's containers (`sandgate.instance`), for operators and the reaper.
    pub instance: String,
    /// The checks that are not ok.
    pub missing: Vec<String>,
    pub replicas: Replicas,
    pub status: ReadyStatus,
}

/// Whether every check is ok (200) or not (503).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReadyStatus {
    Ready,
    Unavailable,
}

/// One dependency: usable or not, and what was seen. `warm_pool` also lists its keys.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Check {
    pub detail: String,
    /// `warm_pool` only: every key the pool holds or wants.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<WarmKey>>,
    pub ok: bool,
    /// `warm_pool` only: container memory all waiting sandboxes hold together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_memory_bytes: Option<u64>,
}

impl Check {
    fn of(result: Result<String, String>) -> Check {
        let (ok, detail) = match result {
            Ok(detail) => (true, detail),
            Err(detail) => (false, detail),
        };
        Check {
            detail,
            keys: None,
            ok,
            waiting_memory_bytes: None,
        }
    }
}

/// A warm pool key: the container it is, how many wait and its target.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WarmKey {
    pub cpus: f64,
    pub disk_mb: u64,
    pub image: String,
    pub language: String,
    pub memory_mb: u64,
    pub mounts: Vec<WarmMount>,
    pub pids: u64,
    /// Whether it refills by restoring a template or by booting.
    pub refill: WarmRefill,
    pub serves: WarmServes,
    pub target: usize,
    pub waiting: usize,
}

/// How a warm key refills: `by` boot or restore (with its template's size, `null` until made),
/// or by boot because restoring failed (`restore_failed` says why).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum WarmRefill {
    Restore {
        by: RefillBy,
        template_bytes: Option<u64>,
    },
    BootAfterFailure {
        by: RefillBy,
        restore_failed: String,
    },
    Boot {
        by: RefillBy,
    },
}

/// What refills a warm key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RefillBy {
    Boot,
    Restore,
}

impl From<Refill> for WarmRefill {
    fn from(refill: Refill) -> WarmRefill {
        match refill {
            Refill::Boot => WarmRefill::Boot { by: RefillBy::Boot },
            Refill::Restore { template_bytes } => WarmRefill::Restore {
                by: RefillBy::Restore,
                template_bytes,
            },
            Refill::BootAfterFailure { cause } => WarmRefill::BootAfterFailure {
                by: RefillBy::Boot,
                restore_failed: cause,
            },
        }
    }
}

/// What a waiting sandbox serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WarmServes {
    Execution,
    Session,
}

/// A dataset a warm key's container has mounted read-only.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WarmMount {
    #[schema(value_type = String)]
    pub source: PathBuf,
    pub target: String,
}

impl From<KeyCount> for WarmKey {
    fn from(count: KeyCount) -> WarmKey {
        let key = count.key;
        WarmKey {
            cpus: key.nano_cpus as f64 / 1e9,
            disk_mb: key.disk_mb,
            image: key.image,
            language: key.language,
            memory_mb: key.memory_mb,
            mounts: key
                .mounts
                .into_iter()
                .map(|m| WarmMount {
                    source: m.source,
                    target: m.target,
                })
                .collect(),
            pids: key.pids,
            refill: WarmRefill::from(count.refill),
            serves: match key.serves {
                Serves::Execution => WarmServes::Execution,
                Serves::Session => WarmServes::Session,
            },
            target: count.target,
            waiting: count.waiting,
        }
    }
}

/// The replicas on this database, or why they could not be read.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Replicas {
    Listed(Vec<ReplicaView>),
    Unreadable { error: String },
}

/// One replica: the policy revision it runs (or why not the one another announced) and
/// whether its heartbeat is within a lease.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ReplicaView {
    pub alive: bool,
    pub heartbeat_at: DateTime<Utc>,
    pub instance: String,
    pub policy_error: Option<String>,
    pub policy_revision: String,
    /// This gateway.
    pub this: bool,
}

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    operation_id = "health_healthz",
    summary = "Liveness.",
    security(()),
    responses(
        (status = 200, description = "the process is up", body = Liveness),
    ),
)]
pub async fn healthz() -> Json<Liveness> {
    Json(Liveness { status: "ok" })
}

#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    operation_id = "health_readyz",
    summary = "Readiness: Docker, runsc, Postgres and the policy all usable.",
    security(()),
    responses(
        (status = 200, description = "ready", body = Readiness),
        (status = 503, description = "a dependency is not usable", body = Readiness),
    ),
)]
pub async fn readyz(State(app): State<Arc<App>>) -> (StatusCode, Json<Readiness>) {
    let checks = checks(&app).await;
    let missing: Vec<String> = checks
        .iter()
        .filter(|(_, check)| !check.ok)
        .map(|(name, _)| name.clone())
        .collect();
    let (status, ready) = if missing.is_empty() {
        (StatusCode::OK, ReadyStatus::Ready)
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, ReadyStatus::Unavailable)
    };
    let body = Readiness {
        checks,
        instance: app.instance.clone(),
        missing,
        replicas: replicas(&app).await,
        status: ready,
    };
    (status, Json(body))
}

/// Every dependency, by name.
async fn checks(app: &App) -> BTreeMap<String, Check> {
    let runtimes: Vec<String> = app
        .config
        .backends
        .values()
        .map(|backend| backend.runtime.clone())
        .collect();
    let (runtime, postgres) = tokio::join!(app.runtime.health(&runtimes), app.audit.ping());
    let mut checks = BTreeMap::new();
    let mut check = |name: String, result: Result<String, String>| {
        checks.insert(name, Check::of(result));
    };
    check("docker".to_owned(), runtime.docker.clone());
    for (name, present) in &runtime.runtimes {
        let result = if runtime.docker.is_err() {
            Err("docker is unreachable".to_owned())
        } else if *present {
            Ok("registered".to_owned())
        } else {
            Err(format!(
                "runtime {name} is not registered in dockerd (run scripts/setup.sh)"
            ))
        };
        check(format!("runtime:{name}"), result);
    }
    check(
        "postgres".to_owned(),
        postgres
            .map(|()| "ok".to_owned())
            .map_err(|err| crate::errors::error_chain(&err)),
    );
    check("policy".to_owned(), policy_check(app));
    check("sandbox_init".to_owned(), init_check(app));
    // Not ready: requests still succeed, cold (the pool's failure is its cause).
    let mut pool = Check::of(app.pool.readiness());
    pool.keys = Some(app.pool.keys().into_iter().map(WarmKey::from).collect());
    pool.waiting_memory_bytes = Some(app.pool.waiting_memory_bytes());
    checks.insert("warm_pool".to_owned(), pool);
    checks
}

fn policy_check(app: &App) -> Result<String, String> {
    match app.policy.current().state.error() {
        None => Ok(app.policy.current().state.revision().to_owned()),
        Some(error) => Err(error.to_owned()),
    }
}

fn init_check(app: &App) -> Result<String, String> {
    if app.init_binary.is_file() {
        Ok(app.init_binary.display().to_string())
    } else {
        Err(format!(
            "{} is missing (make build)",
            app.init_binary.display()
        ))
    }
}

/// Every replica on this database. Not a readiness condition: another replica's state does
/// not stop this one from serving.
async fn replicas(app: &App) -> Replicas {
    let lease = chrono::Duration::milliseconds(i64::try_from(app.config.lease_ms).unwrap_or(0));
    let now = Utc::now();
    match app.audit.replicas().await {
        Ok(rows) => Replicas::Listed(
            rows.into_iter()
                .map(|row| replica_view(row, lease, now, &app.instance))
                .collect(),
        ),
        Err(err) => Replicas::Unreadable {
            error: crate::errors::error_chain(&err),
        },
    }
}

fn replica_view(
    row: ReplicaRow,
    lease: chrono::Duration,
    now: DateTime<Utc>,
    instance: &str,
) -> ReplicaView {
    ReplicaView {
        alive: row.heartbeat_at + lease > now,
        this: row.instance == instance,
        heartbeat_at: row.heartbeat_at,
        instance: row.instance,
        policy_error: row.policy_error,
        policy_revision: row.policy_revision,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn at() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-03T09:30:00.123456Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    /// The bytes axum writes for `typed` are the bytes of the `json!` it replaced.
    fn same<T: Serialize>(typed: &T, old: serde_json::Value) {
        assert_eq!(serde_json::to_string(typed).unwrap(), old.to_string());
    }

    #[test]
    fn liveness_is_written_as_before() {
        same(&Liveness { status: "ok" }, json!({"status": "ok"}));
    }

    #[test]
    fn readiness_is_written_as_before() {
        let mut checks = BTreeMap::new();
        checks.insert("docker".to_owned(), Check::of(Ok("29.1".to_owned())));
        checks.insert("policy".to_owned(), Check::of(Err("no bundle".to_owned())));
        let mut pool = Check::of(Ok("waiting: python=1".to_owned()));
        pool.keys = Some(vec![WarmKey {
            cpus: 0.5,
            disk_mb: 64,
            image: "sandgate/python:3.12".to_owned(),
            language: "python".to_owned(),
            memory_mb: 256,
            mounts: vec![WarmMount {
                source: PathBuf::from("/srv/data/ref"),
                target: "/data/ref".to_owned(),
            }],
            pids: 64,
            refill: WarmRefill::Restore {
                by: RefillBy::Restore,
                template_bytes: Some(1_048_576),
            },
            serves: WarmServes::Session,
            target: 2,
            waiting: 1,
        }]);
        pool.waiting_memory_bytes = Some(268_435_456);
        checks.insert("warm_pool".to_owned(), pool);
        let replica = ReplicaView {
            alive: true,
            heartbeat_at: at(),
            instance: "gw-a".to_owned(),
            policy_error: None,
            policy_revision: "sha256:ab".to_owned(),
            this: true,
        };
        let typed = Readiness {
            checks,
            instance: "gw-a".to_owned(),
            missing: vec!["policy".to_owned()],
            replicas: Replicas::Listed(vec![replica]),
            status: ReadyStatus::Unavailable,
        };
        // The literal the handler built before, field by field.
        let key = json!({
            "language": "python",
            "serves": "session",
            "image": "sandgate/python:3.12",
            "memory_mb": 256,
            "cpus": 500_000_000_f64 / 1e9,
            "pids": 64,
            "disk_mb": 64,
            "mounts": [json!({"source": PathBuf::from("/srv/data/ref"), "target": "/data/ref"})],
        });
        let mut key = key;
        key.as_object_mut()
            .unwrap()
            .insert("waiting".to_owned(), json!(1));
        key.as_object_mut()
            .unwrap()
            .insert("target".to_owned(), json!(2));
        let refill = Refill::Restore {
            template_bytes: Some(1_048_576),
        };
        key.as_object_mut()
            .unwrap()
            .insert("refill".to_owned(), refill.describe());
        let old = json!({
            "status": "unavailable",
            "missing": ["policy"],
            "checks": {
                "docker": {"ok": true, "detail": "29.1"},
                "policy": {"ok": false, "detail": "no bundle"},
                "warm_pool": {"ok": true, "detail": "waiting: python=1", "keys": [key],
                              "waiting_memory_bytes": 268_435_456_u64},
            },
            "instance": "gw-a",
            "replicas": [json!({
                "instance": "gw-a",
                "policy_revision": "sha256:ab",
                "policy_error": null,
                "heartbeat_at": at(),
                "alive": true,
                "this": true,
            })],
        });
        same(&typed, old);
        // What `/readyz` wrote before: `Refill::describe`.
        for refill in [
            Refill::Boot,
            Refill::Restore {
                template_bytes: None,
            },
            Refill::Restore {
                template_bytes: Some(7),
            },
            Refill::BootAfterFailure {
                cause: "criu: no space".to_owned(),
            },
        ] {
            let old = refill.describe();
            same(&WarmRefill::from(refill), old);
        }
        same(
            &Replicas::Unreadable {
                error: "pool timed out".to_owned(),
            },
            json!({"error": "pool timed out"}),
        );
    }
}
