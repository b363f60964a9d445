//! The isolation and limit suites run twice: cold (the default) and warm
//! (`SANDGATE_TEST_START=warm`, see the Makefile's `test` target). In warm mode every gateway
//! keeps one pooled sandbox per language waiting, and every execution the pool can serve must
//! have run in one: the harness waits for a waiting sandbox before it sends the request and
//! asserts `"start": "warm"` on the answer when `/readyz` said a sandbox of the decision's key
//! (its whole container) was waiting when the request was sent.

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

/// In warm mode: at least one waiting sandbox per language, shaped like tenant acme's
/// decisions (other shapes are pooled once asked for), with no preload (the runner is the
/// same; importing pandas ahead would cost every test seconds).
pub fn configure(config: &mut Config) {
    if mode() == Start::Warm {
        config.warm_pool = BTreeMap::from([("python".to_owned(), 1), ("bash".to_owned(), 1)]);
        config.python_preload = Vec::new();
    }
}

/// What the pool had waiting when the last request was sent (its `/readyz` keys), so the
/// answer can be checked against it: a decision whose key had a sandbox waiting must have been
/// served warm, whatever its shape.
#[derive(Debug, Default)]
pub struct Mirror {
    waiting: Mutex<Vec<Value>>,
}

/// Whether a `/readyz` key is the container of this record (an execution without mounts).
fn same_container(key: &Value, language: &str, record: &Value) -> bool {
    let limits = &record["limits"];
    let cpus_equal = match (key["cpus"].as_f64(), limits["cpus"].as_f64()) {
        (Some(a), Some(b)) => (a - b).abs() < 1e-6,
        _ => false,
    };
    key["language"] == language
        && key["serves"] == "execution"
        && key["mounts"].as_array().is_some_and(Vec::is_empty)
        && key["memory_mb"] == limits["memory_mb"]
        && key["pids"] == limits["pids"]
        && key["disk_mb"] == limits["disk_mb"]
        && cpus_equal
}

impl Mirror {
    /// Whether the pool may serve `language` at all (a warm gateway pools every language with
    /// an image; the harness checks executions without dataset mounts).
    pub fn pools(&self, language: &str, request: &Value) -> bool {
        mode() == Start::Warm
            && matches!(language, "python" | "bash")
            && request["mounts"].as_array().is_none_or(Vec::is_empty)
    }

    /// Before a request: waits (up to a minute) until every execution key of `language` the
    /// pool wants has a sandbox waiting, and remembers which keys have one.
    pub async fn settle(&self, http: &reqwest::Client, url: &str, language: &str) {
        let mut keys = Vec::new();
        for _ in 0..600 {
            keys = pool_keys(http, url).await;
            let settled = keys
                .iter()
                .filter(|k| k["language"] == language && k["serves"] == "execution")
                .all(|k| k["target"].as_u64() == Some(0) || k["waiting"].as_u64() > Some(0));
            if settled {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        keys.retain(|k| k["waiting"].as_u64() > Some(0));
        *self.waiting.lock().unwrap() = keys;
    }

    /// After an answer: whether it had to be warm (a sandbox of its key waited).
    pub fn expect_warm(&self, language: &str, request: &Value, record: &Value) -> bool {
        if !self.pools(language, request) || record["limits"].is_null() {
            return false;
        }
        self.waiting
            .lock()
            .unwrap()
            .iter()
            .any(|key| same_container(key, language, record))
    }
}

/// The warm pool's keys as `/readyz` lists them.
pub async fn pool_keys(http: &reqwest::Client, url: &str) -> Vec<Value> {
    let ready: Value = http
        .get(format!("{url}/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    ready["checks"]["warm_pool"]["keys"]
        .as_array()
        .cloned()
        .unwrap_or_default()
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
