//! Liveness and readiness. `/readyz` names every dependency that is not usable.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use crate::app::App;

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    operation_id = "health_healthz",
    summary = "Liveness.",
    security(()),
    responses(
        (status = 200, description = "the process is up", body = serde_json::Value),
    ),
)]
pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    operation_id = "health_readyz",
    summary = "Readiness: Docker, runsc, Postgres and the policy all usable.",
    security(()),
    responses(
        (status = 200, description = "ready", body = serde_json::Value),
        (status = 503, description = "a dependency is not usable", body = serde_json::Value),
    ),
)]
pub async fn readyz(State(app): State<Arc<App>>) -> (StatusCode, Json<Value>) {
    let runtimes: Vec<String> = app
        .config
        .backends
        .values()
        .map(|backend| backend.runtime.clone())
        .collect();
    let (runtime, postgres) = tokio::join!(app.runtime.health(&runtimes), app.audit.ping());
    let mut checks = BTreeMap::new();
    let mut check = |name: String, result: Result<String, String>| {
        let value = match result {
            Ok(detail) => json!({"ok": true, "detail": detail}),
            Err(detail) => json!({"ok": false, "detail": detail}),
        };
        checks.insert(name, value);
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
    check(
        "policy".to_owned(),
        match app.policy.current().state.error() {
            None => Ok(app.policy.current().state.revision().to_owned()),
            Some(error) => Err(error.to_owned()),
        },
    );
    check(
        "sandbox_init".to_owned(),
        if app.init_binary.is_file() {
            Ok(app.init_binary.display().to_string())
        } else {
            Err(format!(
                "{} is missing (make build)",
                app.init_binary.display()
            ))
        },
    );
    // Not ready: requests still succeed, cold (the pool's failure is its cause).
    check("warm_pool".to_owned(), app.pool.readiness());
    if let Some(Value::Object(pool)) = checks.get_mut("warm_pool") {
        pool.insert("keys".to_owned(), warm_keys(&app));
        pool.insert(
            "waiting_memory_bytes".to_owned(),
            json!(app.pool.waiting_memory_bytes()),
        );
    }
    let missing: Vec<&String> = checks
        .iter()
        .filter(|(_, value)| value["ok"] == json!(false))
        .map(|(name, _)| name)
        .collect();
    let status = if missing.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if missing.is_empty() { "ready" } else { "unavailable" },
        "missing": missing,
        "checks": checks,
        // Labels this gateway's containers (`sandgate.instance`), for operators and the reaper.
        "instance": app.instance,
        "replicas": replicas(&app).await,
    });
    (status, Json(body))
}

/// Every key the warm pool holds or wants: the container it is, what waits and its target.
fn warm_keys(app: &App) -> Value {
    Value::Array(
        app.pool
            .keys()
            .into_iter()
            .map(|count| {
                let mut key = count.key.describe();
                if let Value::Object(fields) = &mut key {
                    fields.insert("waiting".to_owned(), json!(count.waiting));
                    fields.insert("target".to_owned(), json!(count.target));
                    fields.insert("refill".to_owned(), count.refill.describe());
                }
                key
            })
            .collect(),
    )
}

/// Every replica on this database: the policy revision it runs (or why not the one another
/// announced) and whether its heartbeat is within a lease. Not a readiness condition: another
/// replica's state does not stop this one from serving.
async fn replicas(app: &App) -> Value {
    let lease = chrono::Duration::milliseconds(i64::try_from(app.config.lease_ms).unwrap_or(0));
    let now = chrono::Utc::now();
    match app.audit.replicas().await {
        Ok(rows) => Value::Array(
            rows.into_iter()
                .map(|row| {
                    json!({
                        "instance": row.instance,
                        "policy_revision": row.policy_revision,
                        "policy_error": row.policy_error,
                        "heartbeat_at": row.heartbeat_at,
                        "alive": row.heartbeat_at + lease > now,
                        "this": row.instance == app.instance,
                    })
                })
                .collect(),
        ),
        Err(err) => json!({"error": crate::errors::error_chain(&err)}),
    }
}
