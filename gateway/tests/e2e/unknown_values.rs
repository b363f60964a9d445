//! The set-up the unknown-stored-value areas share (`types_unknown_values`,
//! `proposals_unknown_values`, `store_unknown_values`): reading the counter of the one rule of
//! `audit::unknown_value`, widening a column's CHECK as a newer version would, and asking for a
//! row that must be refused. Not an area of its own: it has no tests.

use serde_json::Value;
use sqlx::PgPool;

use crate::common::TestGateway;

/// `sandgate_store_unknown_values_total{column="<column>"}` as `/metrics` shows it.
pub async fn counted(gw: &TestGateway, admin: &str, column: &str) -> f64 {
    let text = gw
        .http
        .get(format!("{}/metrics", gw.url))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = format!("sandgate_store_unknown_values_total{{column=\"{column}\"}} ");
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no {series}in\n{text}"));
    line.parse().unwrap()
}

/// Drops `table`'s CHECK `constraint`: the widening a newer version's migration would make, so
/// a value outside this version's set can be stored.
pub async fn widen(pool: &PgPool, table: &str, constraint: &str) {
    sqlx::query(&format!("ALTER TABLE {table} DROP CONSTRAINT {constraint}"))
        .execute(pool)
        .await
        .unwrap();
}

/// Sets `column` of `table`'s row `id` to `value` (outside its set, once widened).
pub async fn store(pool: &PgPool, table: &str, column: &str, id: &str, value: &str) {
    sqlx::query(&format!("UPDATE {table} SET {column} = $2 WHERE id = $1"))
        .bind(id)
        .bind(value)
        .execute(pool)
        .await
        .unwrap();
}

/// `GET path` answers 500 `internal` and shows none of `unknown` as a value.
pub async fn refused(gw: &TestGateway, key: &str, path: &str, unknown: &[&str]) {
    let (status, body): (u16, Value) = gw.get(key, path).await;
    assert_eq!(status, 500, "{path}: {body}");
    assert_eq!(body["error"]["code"], "internal", "{path}: {body}");
    for value in unknown {
        assert!(!body.to_string().contains(value), "{path}: {body}");
    }
}
