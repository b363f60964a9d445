//! `allow_internet_access` end to end through E2B's own Python SDK, the real proxy and an
//! upstream in a network namespace of this machine (scripts/netns.sh), never anywhere else:
//! with `true` a sandbox reaches at most what the policy grants (the granted upstream through
//! the proxy; an ungranted host refused by the proxy with the policy's code; no direct socket),
//! with `false` nothing (the proxy refuses `egress.no_grant`).

use crate::common;

use common::egress::{bundle_with_test_tenant, gateway_with, upstream, UPSTREAM};

/// The shipped policy grants no network to an E2B create (it names no destination). This test
/// policy grants an E2B sandbox asking `allow_internet_access: true` its tenant's allowlist
/// (hosts and ports as listed): what a security team could write on `request.e2b`.
const E2B_GRANT: &str = r#"network_part := {"require_approval": false, "reasons": [], "network": e2b_grant} if {
	input.request.kind == "session"
	input.request.e2b.allow_internet_access == true
} else := {"require_approval": false, "reasons": []} if {
	input.request.network == []
}"#;

const E2B_GRANT_RULE: &str = r#"
e2b_grant := {
	"allow": [{"host": rule.host, "ports": rule.ports} | some rule in tenant.network.allow],
	"max_connections": tenant.network.max_connections,
	"max_bytes": tenant.network.max_bytes,
}
"#;

/// What the agent platform does. `{port}` and `{upstream}` are filled in.
const AGENT: &str = r#"
import json
from e2b import Sandbox

FETCH = '''
import json, socket, sys, urllib.request, urllib.error
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()]
    except Exception as e:
        return ["error", repr(e)]
out = {"granted": fetch("http://files.test:PORT/hello.txt"),
       "ungranted": fetch("http://evil.example:PORT/")}
try:
    socket.create_connection(("UPSTREAM", PORT), timeout=5)
    out["direct"] = "connected"
except OSError as e:
    out["direct"] = type(e).__name__
print(json.dumps(out))
'''.replace("PORT", "{port}").replace("UPSTREAM", "{upstream}")

out = {}
for allowed in (True, False):
    sbx = Sandbox.create(template="base", allow_internet_access=allowed, timeout=120)
    sbx.files.write("/tmp/fetch.py", FETCH)
    r = sbx.commands.run("python3 /tmp/fetch.py")
    out[str(allowed).lower()] = json.loads(r.stdout)
    out[str(allowed).lower() + "_id"] = sbx.sandbox_id
    sbx.kill()
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn allow_internet_access_true_reaches_at_most_the_policy_grant_false_nothing() {
    common::require_docker();
    let upstream = upstream();
    let port = upstream.port;
    let policies = bundle_with_test_tenant(&[("files.test", port)]);
    let rego = policies.path().join("execution.rego");
    let text = std::fs::read_to_string(&rego).unwrap();
    let shipped = "network_part := {\"require_approval\": false, \"reasons\": []} if {\n\tinput.request.network == []\n}";
    assert!(text.contains(shipped), "the shipped network_part changed");
    let text = text.replace(shipped, E2B_GRANT) + E2B_GRANT_RULE;
    std::fs::write(&rego, text).unwrap();
    let gw = gateway_with(policies.path(), &[("files.test", UPSTREAM)]).await;
    let agent = gw.key("agent", "nettest").await;
    let script = AGENT
        .replace("{port}", &port.to_string())
        .replace("{upstream}", UPSTREAM);
    let said = common::e2b_agent(&script, &gw.url, &agent, &[]).await;
    eprintln!("the agent saw: {said:#}");

    let with = &said["true"];
    assert_eq!(
        with["granted"],
        serde_json::json!([200, "hello through the proxy\n"]),
        "true: the granted upstream through the proxy: {said}"
    );
    let refused = &with["ungranted"];
    assert_eq!(refused[0], 403, "{said}");
    let text = refused[1].as_str().unwrap();
    assert!(
        text.starts_with("sandgate-egress: ") && text.contains("egress.host_not_granted"),
        "true: an ungranted host is refused with the policy's code: {text}"
    );
    assert_ne!(with["direct"], "connected", "no direct socket: {said}");

    let without = &said["false"];
    for case in ["granted", "ungranted"] {
        let answer = &without[case];
        assert_eq!(answer[0], 403, "false, {case}: {said}");
        let text = answer[1].as_str().unwrap();
        assert!(
            text.starts_with("sandgate-egress: egress.no_grant"),
            "false, {case}: no grant at all: {text}"
        );
    }
    assert_ne!(without["direct"], "connected", "{said}");

    // The grant is the session's decision, recorded: the policy's network for `true`, none
    // for `false`; the proxy recorded the granted connection for the sandbox.
    let pool = gw.pool().await;
    for (id, granted) in [(&said["true_id"], true), (&said["false_id"], false)] {
        let network: Option<serde_json::Value> =
            sqlx::query_scalar("SELECT decision -> 'network' FROM sessions WHERE id = $1")
                .bind(id.as_str().unwrap())
                .fetch_one(&pool)
                .await
                .unwrap();
        let network = network.filter(|n| !n.is_null());
        assert_eq!(network.is_some(), granted, "{id}: {network:?}");
    }
    let allowed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE kind = 'egress.connection' \
         AND input ->> 'session_id' = $1 AND allow",
    )
    .bind(said["true_id"].as_str().unwrap())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(allowed, 1, "the one granted connection, audited");
    pool.close().await;
    gw.stop().await;
}

/// A policy that grants every E2B sandbox its tenant's allowlist, whatever it asks.
const E2B_GRANT_ALWAYS: &str = r#"network_part := {"require_approval": false, "reasons": [], "network": e2b_grant} if {
	input.request.kind == "session"
	input.request.e2b
} else := {"require_approval": false, "reasons": []} if {
	input.request.network == []
}"#;

const AGENT_FALSE: &str = r#"
import json
from e2b import Sandbox, SandboxException
out = {}
try:
    sbx = Sandbox.create(template="base", allow_internet_access=False, timeout=60)
    out["false"] = "created " + sbx.sandbox_id
    sbx.kill()
except SandboxException as e:
    out["false"] = str(e)
sbx = Sandbox.create(template="base", allow_internet_access=True, timeout=60)
out["true"] = sbx.sandbox_id
sbx.kill()
print(json.dumps(out))
"#;

/// `false` is the gateway's to keep, not only the policy's: a decision that grants network to
/// a sandbox asking `allow_internet_access: false` is refused (403) and its session closed.
#[tokio::test(flavor = "multi_thread")]
async fn allow_internet_access_false_refuses_a_policy_that_grants_network_anyway() {
    common::require_docker();
    let policies = bundle_with_test_tenant(&[("files.test", 8080)]);
    let rego = policies.path().join("execution.rego");
    let text = std::fs::read_to_string(&rego).unwrap();
    let shipped = "network_part := {\"require_approval\": false, \"reasons\": []} if {\n\tinput.request.network == []\n}";
    let text = text.replace(shipped, E2B_GRANT_ALWAYS) + E2B_GRANT_RULE;
    std::fs::write(&rego, text).unwrap();
    let gw = gateway_with(policies.path(), &[("files.test", UPSTREAM)]).await;
    let agent = gw.key("agent", "nettest").await;
    let said = common::e2b_agent(AGENT_FALSE, &gw.url, &agent, &[]).await;
    let refused = said["false"].as_str().unwrap();
    assert!(
        refused.contains("403") && refused.contains("allow_internet_access is false"),
        "{refused}"
    );
    assert!(said["true"].as_str().unwrap().starts_with("ss_"), "{said}");
    let pool = gw.pool().await;
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sessions WHERE status <> 'closed' AND decision -> 'network' IS NOT NULL \
         AND id <> $1",
    )
    .bind(said["true"].as_str().unwrap())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(open, 0, "the refused sandbox's session is closed");
    pool.close().await;
    gw.stop().await;
}
