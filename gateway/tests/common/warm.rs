//! The isolation and limit suites run twice: cold (the default) and warm
//! (`SANDGATE_TEST_START=warm`, see the Makefile's `test` target). In warm mode every gateway
//! keeps one pooled sandbox per language waiting, and every execution the pool can serve must
//! have run in one: the harness waits for a waiting sandbox before it sends the request and
//! asserts `"start": "warm"` on the answer. It mirrors the pool's rule for what it serves
//! (no dataset mount, python at 512 MB or more, the shape the pool was last asked for).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use gateway::config::Config;

/// How this test run starts sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Cold,
    Warm,
}

pub fn mode() -> Start {
    match std::env::var("SANDGATE_TEST_START").as_deref() {
        Err(_) | Ok("" | "cold") => Start::Cold,
        Ok("warm") => Start::Warm,
        Ok(other) => panic!("SANDGATE_TEST_START={other}: use cold or warm"),
    }
}

/// In warm mode: one waiting sandbox per language, shaped like tenant acme's decisions, with
/// no preload (the runner is the same; importing pandas ahead would cost every test seconds).
pub fn configure(config: &mut Config) {
    if mode() == Start::Warm {
        config.warm_pool = BTreeMap::from([("python".to_owned(), 1), ("bash".to_owned(), 1)]);
        config.python_preload = Vec::new();
    }
}

/// The pool's shape per language, as this gateway's pool has it (a mirror of `app::pool`).
#[derive(Debug, Default)]
pub struct Mirror {
    shapes: Mutex<BTreeMap<String, Value>>,
}

/// The container limits of a record (what the pool keys on).
fn shape(record: &Value) -> Value {
    let limits = &record["limits"];
    serde_json::json!([
        limits["memory_mb"],
        limits["cpus"],
        limits["pids"],
        limits["disk_mb"]
    ])
}

impl Mirror {
    fn seeded() -> serde_json::Value {
        let limits = gateway::config::WarmPoolLimits::default();
        serde_json::json!([limits.memory_mb, limits.cpus, limits.pids, limits.disk_mb])
    }

    /// Whether the pool may serve `language` at all (a warm gateway pools python and bash).
    pub fn pools(&self, language: &str, request: &Value) -> bool {
        mode() == Start::Warm
            && matches!(language, "python" | "bash")
            && request["mounts"].as_array().is_none_or(Vec::is_empty)
    }

    /// After an answer: whether it had to be warm, and the pool's shape from now on.
    pub fn expect_warm(&self, language: &str, request: &Value, record: &Value) -> bool {
        if !self.pools(language, request) || record["limits"].is_null() {
            return false;
        }
        let wanted = shape(record);
        if language == "python" && wanted[0].as_u64().unwrap_or(0) < 512 {
            return false;
        }
        let mut shapes = self.shapes.lock().unwrap();
        let current = shapes
            .entry(language.to_owned())
            .or_insert_with(Mirror::seeded);
        let warm = *current == wanted;
        *current = wanted;
        warm
    }
}

/// Waits (up to a minute) until `/readyz` says a sandbox for `language` waits.
pub async fn wait_for_waiting(http: &reqwest::Client, url: &str, language: &str) {
    let wanted = format!("{language}=");
    for _ in 0..600 {
        let ready: Value = http
            .get(format!("{url}/readyz"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let detail = ready["checks"]["warm_pool"]["detail"]
            .as_str()
            .unwrap_or("");
        let waiting = detail
            .split_whitespace()
            .find_map(|part| part.strip_prefix(&wanted))
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0);
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no pooled {language} sandbox became ready within a minute");
}
