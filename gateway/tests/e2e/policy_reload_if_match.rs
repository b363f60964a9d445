//! `sandgate policy reload --if-match REVISION` (issue 25) through the real CLI binary against
//! a live gateway: a stale revision is refused with `revision_conflict` and changes nothing; the
//! active one (given bare: the CLI quotes it) reloads; `*` reloads whatever is loaded.

use crate::common;

use std::process::Command;

use common::{copy_of_shipped, TestGateway};

fn sandgate(gw: &TestGateway, key: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(args)
        .env("SANDGATE_URL", &gw.url)
        .env("SANDGATE_KEY", key)
        .output()
        .unwrap()
}

async fn active(gw: &TestGateway, admin: &str) -> String {
    let (status, policy) = gw.get(admin, "/v1/policy").await;
    assert_eq!(status, 200, "{policy}");
    policy["revision"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_reloads_only_on_the_revision_it_names() {
    let shipped = copy_of_shipped();
    let policy_dir = shipped.path().to_owned();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), move |config| {
        config.policy_dir = policy_dir;
    })
    .await;
    let admin = gw.key("admin", "ops").await;
    let first = active(&gw, &admin).await;

    // A candidate with another revision, from a stale precondition: refused, nothing changes.
    let candidate = copy_of_shipped();
    let rego = candidate.path().join("execution.rego");
    let text = std::fs::read_to_string(&rego).unwrap() + "\n# another revision\n";
    std::fs::write(&rego, text).unwrap();
    let dir = candidate.path().to_str().unwrap();
    let stale = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let out = sandgate(
        &gw,
        &admin,
        &["policy", "reload", "--dir", dir, "--if-match", stale],
    );
    let said = format!("{out:?}");
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("revision_conflict"), "{said}");
    assert_eq!(active(&gw, &admin).await, first);

    // The active revision, bare: the CLI quotes it as an entity tag; it reloads.
    let out = sandgate(
        &gw,
        &admin,
        &["policy", "reload", "--dir", dir, "--if-match", &first],
    );
    assert!(out.status.success(), "{out:?}");
    let second = active(&gw, &admin).await;
    assert_ne!(second, first);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("accepted revision {second}")),
        "{out:?}"
    );

    // `*`: any loaded revision.
    let out = sandgate(&gw, &admin, &["policy", "reload", "--if-match", "*"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        active(&gw, &admin).await,
        first,
        "the policy directory again"
    );
    gw.stop().await;
}
