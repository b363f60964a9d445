//! The listings (`GET /v1/executions`, `GET /v1/audit/events`) and key creation over the API
//! (`POST /v1/keys`): scoping, filters, paging, bounds, and that a new key is stored as a hash
//! and audited.

use crate::common;

use serde_json::{json, Value};

use common::TestGateway;

/// A key made through the API by `admin`.
async fn api_key(gw: &TestGateway, admin: &str, role: &str, tenant: &str) -> String {
    let (status, created) = gw
        .post(admin, "/v1/keys", &json!({"role": role, "tenant": tenant}))
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["role"], role);
    assert_eq!(created["tenant"], tenant);
    created["key"].as_str().unwrap().to_owned()
}

/// A request the policy denies: recorded (status `denied`), nothing runs.
async fn denied(gw: &TestGateway, key: &str) -> String {
    let (status, body) = gw.execute(key, "cobol", "x", json!({})).await;
    assert_eq!(status, 403, "{body}");
    body["error"]["execution_id"].as_str().unwrap().to_owned()
}

fn ids(page: &Value, list: &str) -> Vec<String> {
    page[list]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_created_over_the_api_are_hashed_and_audited() {
    let gw = TestGateway::start().await;
    let admin = gw.key("admin", "ops").await;
    let (status, created) = gw
        .post(
            &admin,
            "/v1/keys",
            &json!({"role": "agent", "tenant": "acme"}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let secret = created["key"].as_str().unwrap();
    let id = created["id"].as_str().unwrap();
    assert!(secret.starts_with("sgk_"), "{created}");
    let (status, _) = gw.get(secret, "/v1/executions").await;
    assert_eq!(status, 200, "the new key works at once");

    let pool = gw.pool().await;
    let (hash, role, tenant): (String, String, String) =
        sqlx::query_as("SELECT key_hash, role, tenant FROM api_keys WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(hash, gateway::audit::key_hash(secret));
    assert_eq!((role.as_str(), tenant.as_str()), ("agent", "acme"));
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM api_keys k, audit_events e \
         WHERE k::text LIKE '%' || $1 || '%' OR e::text LIKE '%' || $1 || '%'",
    )
    .bind(secret)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stored, 0, "the secret itself is stored nowhere");
    let (creator, input, decision): (Option<String>, Value, Value) = sqlx::query_as(
        "SELECT key_id, input, decision FROM audit_events \
         WHERE kind = 'key.create' AND decision ->> 'created_key_id' = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    let admin_id = gateway::audit::claimed_key_id(&admin).unwrap();
    assert_eq!(creator.as_deref(), Some(admin_id.as_str()));
    assert_eq!(input["role"], "agent");
    assert_eq!(input["via"], "api");
    assert_eq!(decision["created_key_id"], id);

    // A named principal is stored with the key, normalised (issue 15, item 12), and named in
    // its event.
    let (status, named) = gw
        .post(
            &admin,
            "/v1/keys",
            &json!({"role": "reviewer", "tenant": "acme", "principal": "Ana Ruiz"}),
        )
        .await;
    assert_eq!(status, 201, "{named}");
    assert_eq!(named["principal"], "ana ruiz");
    let stored: (String, Value) = sqlx::query_as(
        "SELECT k.principal, e.input FROM api_keys k JOIN audit_events e \
         ON e.kind = 'key.create' AND e.decision ->> 'created_key_id' = k.id WHERE k.id = $1",
    )
    .bind(named["id"].as_str().unwrap())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stored.0, "ana ruiz");
    assert_eq!(stored.1["principal"], "ana ruiz");
    assert_eq!(
        created["principal"], id,
        "default principal: the key itself"
    );

    for (body, why) in [
        (json!({"role": "root", "tenant": "acme"}), "unknown role"),
        (
            json!({"role": "agent", "tenant": "acme", "principal": ""}),
            "empty principal",
        ),
        (json!({"role": "agent", "tenant": "a b"}), "bad tenant name"),
        (json!({"role": "agent", "tenant": ""}), "empty tenant"),
        (
            json!({"role": "agent", "tenant": "acme", "admin": true}),
            "unknown field",
        ),
    ] {
        let (status, answer) = gw.post(&admin, "/v1/keys", &body).await;
        assert_eq!(status, 400, "{why}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request", "{why}");
    }
    pool.close().await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn execution_listing_is_scoped_filtered_and_paged() {
    let gw = TestGateway::start().await;
    let admin = gw.key("admin", "ops").await;
    let acme = api_key(&gw, &admin, "agent", "acme").await;
    let globex = api_key(&gw, &admin, "agent", "globex").await;
    let reviewer = api_key(&gw, &admin, "reviewer", "acme").await;
    let mut acme_ids = Vec::new();
    for _ in 0..3 {
        acme_ids.push(denied(&gw, &acme).await);
    }
    let mut all_ids = acme_ids.clone();
    for _ in 0..2 {
        all_ids.push(denied(&gw, &globex).await);
    }
    acme_ids.reverse();
    all_ids.reverse();

    // Agents: their own tenant only, newest first, whatever `tenant` says.
    for path in ["/v1/executions", "/v1/executions?tenant=globex"] {
        let (status, page) = gw.get(&acme, path).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(ids(&page, "executions"), acme_ids, "{path}");
        assert!(page.get("next_before").is_none(), "{page}");
    }
    // Everyone else: all tenants; `tenant` and `status` filter.
    let (_, page) = gw.get(&reviewer, "/v1/executions").await;
    assert_eq!(ids(&page, "executions"), all_ids);
    let row = &page["executions"][0];
    assert_eq!(row["status"], "denied");
    assert_eq!(row["decision"]["allow"], false);
    assert_eq!(
        row["decision"]["reasons"][0]["code"], "tenant.unknown",
        "{row}"
    );
    assert!(row.get("stdout").is_none(), "listings carry no output");
    assert!(row.get("stderr").is_none(), "listings carry no output");
    // Otherwise the record as GET /v1/executions/{id} has it.
    let (_, mut record) = gw
        .get(&reviewer, &format!("/v1/executions/{}", all_ids[0]))
        .await;
    let record = record.as_object_mut().unwrap();
    record.remove("stdout");
    record.remove("stderr");
    // ... and without what only the single record reads from the decision event.
    record.remove("files");
    record.remove("grant");
    assert_eq!(&Value::Object(record.clone()), row);
    let (_, page) = gw.get(&reviewer, "/v1/executions?tenant=globex").await;
    assert_eq!(ids(&page, "executions"), all_ids[..2]);
    let (_, page) = gw.get(&admin, "/v1/executions?status=denied").await;
    assert_eq!(ids(&page, "executions").len(), 5);
    let (_, page) = gw.get(&admin, "/v1/executions?status=succeeded").await;
    assert_eq!(ids(&page, "executions").len(), 0);

    // Pages of two, following `next_before`.
    let mut seen = Vec::new();
    let mut path = "/v1/executions?limit=2".to_owned();
    loop {
        let (status, page) = gw.get(&reviewer, &path).await;
        assert_eq!(status, 200, "{page}");
        seen.extend(ids(&page, "executions"));
        match page["next_before"].as_str() {
            Some(before) => path = format!("/v1/executions?limit=2&before={before}"),
            None => break,
        }
    }
    assert_eq!(seen, all_ids);

    for path in [
        "/v1/executions?status=bogus",
        "/v1/executions?limit=0",
        "/v1/executions?limit=-1",
        "/v1/executions?owner=me",
    ] {
        let (status, answer) = gw.get(&reviewer, path).await;
        assert_eq!(status, 400, "{path}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request", "{path}");
    }
    let (status, _) = gw.get(&reviewer, "/v1/executions?limit=100000").await;
    assert_eq!(status, 200, "a large limit is lowered, not refused");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_events_are_filtered_and_paged_newest_first() {
    let gw = TestGateway::start().await;
    let agent = gw.key("agent", "acme").await;
    let auditor = gw.key("auditor", "audit").await;
    let mut executions = Vec::new();
    for _ in 0..3 {
        executions.push(denied(&gw, &agent).await);
    }

    let (status, page) = gw
        .get(&auditor, "/v1/audit/events?kind=execution.decision")
        .await;
    assert_eq!(status, 200, "{page}");
    let events = page["events"].as_array().unwrap();
    assert_eq!(events.len(), 3, "{page}");
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] > w[1]),
        "newest first: {seqs:?}"
    );
    assert_eq!(events[0]["execution_id"], executions[2].as_str());
    assert_eq!(events[0]["allow"], false);
    assert_eq!(events[0]["hash"].as_str().unwrap().len(), 64);
    assert!(events[0]["input"]["request"].is_object(), "{page}");

    let path = format!("/v1/audit/events?execution_id={}", executions[0]);
    let (_, page) = gw.get(&auditor, &path).await;
    assert_eq!(page["events"].as_array().unwrap().len(), 1, "{page}");
    let (_, page) = gw
        .get(
            &auditor,
            "/v1/audit/events?since=1h&kind=execution.decision",
        )
        .await;
    assert_eq!(page["events"].as_array().unwrap().len(), 3);
    let (_, page) = gw
        .get(&auditor, "/v1/audit/events?since=2999-01-01T00:00:00Z")
        .await;
    assert_eq!(page["events"].as_array().unwrap().len(), 0);
    // Empty parameters do not filter.
    let (_, page) = gw
        .get(&auditor, "/v1/audit/events?kind=&execution_id=&since=")
        .await;
    let total = page["events"].as_array().unwrap().len();
    assert!(total >= 5, "3 decisions and 2 keys: {page}");

    // Pages of two cover every event once, newest first.
    let mut seen = Vec::new();
    let mut path = "/v1/audit/events?limit=2".to_owned();
    loop {
        let (_, page) = gw.get(&auditor, &path).await;
        seen.extend(
            page["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["seq"].as_i64().unwrap()),
        );
        match page["next_before"].as_i64() {
            Some(before) => path = format!("/v1/audit/events?limit=2&before={before}"),
            None => break,
        }
    }
    let expected: Vec<i64> = (1..=seen.len() as i64).rev().collect();
    assert_eq!(seen, expected, "every seq once, newest first");

    for path in [
        "/v1/audit/events?since=yesterday",
        "/v1/audit/events?limit=0",
        "/v1/audit/events?before=x",
        "/v1/audit/events?tenant=acme",
    ] {
        let (status, answer) = gw.get(&auditor, path).await;
        assert_eq!(status, 400, "{path}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request", "{path}");
    }
    gw.stop().await;
}

/// Filters that no record can match are refused with what is valid, not answered with an empty
/// page; `kind` takes a family (`approval.*`); a role refused names the roles that may call.
#[tokio::test(flavor = "multi_thread")]
async fn filters_that_cannot_match_are_refused_saying_what_is_valid() {
    let gw = TestGateway::start().await;
    let admin = gw.key("admin", "ops").await;
    let auditor = gw.key("auditor", "ops").await;
    let acme = gw.key("agent", "acme").await;
    let globex = gw.key("agent", "globex").await;
    let id = denied(&gw, &acme).await;

    let (status, body) = gw.get(&acme, "/v1/executions?before=yesterday").await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("next_before"), "{message}");
    let (status, body) = gw
        .get(&globex, &format!("/v1/executions?before={id}"))
        .await;
    assert_eq!(status, 400, "another tenant's id is no cursor: {body}");
    let (status, body) = gw.get(&acme, &format!("/v1/executions?before={id}")).await;
    assert_eq!(status, 200, "{body}");

    let (status, body) = gw.get(&auditor, "/v1/audit/events?kind=nonsense").await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("execution.decision") && message.contains("approval.*"),
        "{message}"
    );
    let (status, page) = gw.get(&auditor, "/v1/audit/events?kind=execution.*").await;
    assert_eq!(status, 200, "{page}");
    let kinds: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["execution.decision"], "{page}");
    let (status, page) = gw.get(&admin, "/v1/audit/events?kind=key.create").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["events"].as_array().unwrap().len(), 4, "{page}");

    let (status, body) = gw.get(&acme, "/v1/audit/events").await;
    assert_eq!(status, 403, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("auditor, admin"), "{message}");
    gw.stop().await;
}

/// Every audit event the gateway writes names an `api_types::EventKind` (so the `kind` filter
/// accepts it): no event kind is written as a bare string.
#[test]
fn every_event_kind_written_is_a_known_kind() {
    let mut pending = vec![common::workspace_root().join("gateway/src")];
    let mut found = 0;
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                !text.contains("kind: \""),
                "{}: an event kind written as a string; name an api_types::EventKind",
                path.display()
            );
            found += text.matches("EventKind::").count();
        }
    }
    assert!(found >= 10, "found only {found} event kinds");
    for kind in api_types::EventKind::ALL {
        assert!(
            gateway::audit::read::KindFilter::parse(kind.as_str()).is_some(),
            "{kind}"
        );
    }
}
