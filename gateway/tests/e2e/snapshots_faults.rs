//! Faults while checkpointing (issue 24 item 8): a full disk under the snapshots directory,
//! and a gateway SIGKILLed mid-checkpoint. In both, nothing half-written is ever restorable
//! (an image is written under `<name>.<instance>.partial` and renamed only once its digest is
//! taken; the session's `paused` row and its stored checkpoint are written after, in one
//! transaction) and the session's state stays consistent: still running after the full disk,
//! closed `gateway_restart` after the kill. Through the real stack: the private experimental
//! dockerd (`snapshots::shared_daemon`), runsc, PostgreSQL, and for the kill a `sandgate serve`
//! process.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::replicas::harness::Shared;
use crate::snapshots::{gateway_with, run, shared_daemon, step};

/// Entries under the snapshots directory's tenant directories.
fn images_under(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for tenant in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for image in std::fs::read_dir(tenant.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            found.push(image.path());
        }
    }
    found
}

async fn stored_pauses(pool: &sqlx::PgPool, id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM session_pauses WHERE session_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A 2 MB tmpfs, unmounted when dropped.
struct TinyDisk(tempfile::TempDir);

impl TinyDisk {
    fn mount() -> TinyDisk {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs (the tests run as root)");
        TinyDisk(dir)
    }
}

impl Drop for TinyDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_while_pausing_keeps_the_session_running_and_leaves_no_image() {
    let disk = TinyDisk::mount();
    let daemon = shared_daemon().await;
    let url = common::fresh_database().await;
    let dir = disk.0.path().to_owned();
    let gw = gateway_with(&daemon, url, tempfile::tempdir().unwrap(), move |config| {
        config.snapshots.dir = Some(dir);
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let (status, session) = gw
        .post(&agent, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_owned();
    run(
        &gw,
        &agent,
        &id,
        "x = 41\nopen('/workspace/kept.txt', 'w').write('kept')",
    )
    .await;

    let (status, refused) = step(&gw, &agent, &id, "pause").await;
    assert_eq!(status, 503, "{refused}");
    let text = refused.to_string();
    assert!(
        text.contains("failed and the session goes on running"),
        "the error says what became of the session: {text}"
    );
    assert!(
        text.to_lowercase().contains("no space"),
        "the error names the full disk: {text}"
    );
    assert!(
        images_under(disk.0.path()).is_empty(),
        "nothing half-written is left: {:?}",
        images_under(disk.0.path())
    );
    assert_eq!(stored_pauses(&gw.pool().await, &id).await, 0);
    let seen = gw.session(&agent, &id).await;
    assert_eq!(seen["status"], "ready", "{seen}");

    // Still running, state intact, never paused.
    let read = run(
        &gw,
        &agent,
        &id,
        "(x + 1, open('/workspace/kept.txt').read())",
    )
    .await;
    assert_eq!(read["result"], "(42, 'kept')", "{read}");
    assert!(read.get("resumed").is_none(), "{read}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_killed_mid_checkpoint_leaves_nothing_restorable_and_closes_the_session() {
    let daemon = shared_daemon().await;
    let shared = Shared::new().await;
    let socket = format!("unix://{}", daemon.socket().display());
    let env = [
        ("DOCKER_HOST", socket.as_str()),
        ("SANDGATE_SNAPSHOTS", "{enabled: true}"),
    ];
    let mut replica = shared.start_with(None, &env).await;
    let data = replica.data.clone();
    let agent = shared.key("agent", "acme").await;
    let (status, session) = shared
        .post(
            &replica,
            &agent,
            "/v1/sessions",
            &json!({"language": "python"}),
        )
        .await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_owned();
    // Incompressible memory, so the checkpoint takes seconds.
    let (status, record) = shared
        .post(
            &replica,
            &agent,
            &format!("/v1/sessions/{id}/executions"),
            &json!({"code": "import os\nblob = os.urandom(160 * 2**20)\nlen(blob)"}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");

    let pausing = {
        let (http, url, agent, id) = (
            shared.http.clone(),
            replica.url.clone(),
            agent.clone(),
            id.clone(),
        );
        tokio::spawn(async move {
            http.post(format!("{url}/v1/sessions/{id}/pause"))
                .bearer_auth(agent)
                .json(&json!({}))
                .send()
                .await
        })
    };
    let snapshots = data.join("snapshots");
    let partial = common::until(
        Duration::from_secs(60),
        "a checkpoint being written",
        || {
            let snapshots = snapshots.clone();
            async move {
                images_under(&snapshots)
                    .into_iter()
                    .find(|image| image.to_string_lossy().ends_with(".partial"))
            }
        },
    )
    .await;
    replica.kill();
    assert!(pausing.await.unwrap().is_err(), "the pause never answered");
    // dockerd finishes (or abandons) the checkpoint it was asked for.
    let instance = replica.instance.clone();
    common::until(Duration::from_secs(120), "the checkpoint ended", || {
        let running = daemon.docker(&[
            "ps",
            "-q",
            "--filter",
            &format!("label=sandgate.instance={instance}"),
        ]);
        async move {
            String::from_utf8_lossy(&running.stdout)
                .trim()
                .is_empty()
                .then_some(())
        }
    })
    .await;
    let pool = sqlx::PgPool::connect(&shared.database_url).await.unwrap();
    assert_eq!(stored_pauses(&pool, &id).await, 0, "no pause was stored");
    let status: String = sqlx::query_scalar("SELECT status FROM sessions WHERE id = $1")
        .bind(&id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_ne!(status, "paused");

    let replica = shared.start_with(Some(&data), &env).await;
    assert!(
        !partial.exists(),
        "the restarted gateway removed the half-written image"
    );
    assert!(
        images_under(&snapshots).is_empty(),
        "{:?}",
        images_under(&snapshots)
    );
    let closed: Value = common::until(Duration::from_secs(60), "the session closed", || {
        let (shared, replica, agent, id) = (&shared, &replica, &agent, &id);
        async move {
            let (_, seen) = shared
                .get(replica, agent, &format!("/v1/sessions/{id}"))
                .await;
            (seen["status"] == "closed").then_some(seen)
        }
    })
    .await;
    assert_eq!(closed["closed_reason"], "gateway_restart", "{closed}");
    let (status, refused) = shared
        .post(
            &replica,
            &agent,
            &format!("/v1/sessions/{id}/executions"),
            &json!({"code": "len(blob)"}),
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(stored_pauses(&pool, &id).await, 0);
    replica.stop().await;
}
