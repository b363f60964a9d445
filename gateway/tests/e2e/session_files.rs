//! The files of an open session's sandbox (`/v1/sessions/{id}/files...`), through the real
//! stack: bytes in and out exactly, list, stat, mkdir, move, remove, each change audited with
//! its SHA-256; paths that leave the writable places, symlinks the program planted (to `/etc`,
//! to another writable place), a FIFO, an oversized upload and another key's session are all
//! refused, and nothing outside is touched.

use crate::common;

use serde_json::{json, Value};
use sha2::Digest as _;

use common::TestGateway;

async fn open(gw: &TestGateway, key: &str) -> String {
    let (status, session) = gw
        .post(key, "/v1/sessions", &json!({"language": "python"}))
        .await;
    assert_eq!(status, 201, "{session}");
    session["id"].as_str().unwrap().to_owned()
}

async fn cell(gw: &TestGateway, key: &str, id: &str, code: &str) -> Value {
    let path = format!("/v1/sessions/{id}/executions");
    let (status, turn) = gw.post(key, &path, &json!({"code": code})).await;
    assert_eq!(status, 200, "{turn}");
    assert_eq!(turn["status"], "succeeded", "{turn}");
    turn
}

fn files(gw: &TestGateway, id: &str, rest: &str) -> String {
    format!("{}/v1/sessions/{id}/files{rest}", gw.url)
}

/// `GET .../files/content?path=`: status and the raw bytes.
async fn read(gw: &TestGateway, key: &str, id: &str, path: &str) -> (u16, Vec<u8>) {
    let response = gw
        .http
        .get(files(gw, id, "/content"))
        .query(&[("path", path)])
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.bytes().await.unwrap().to_vec())
}

async fn write(
    gw: &TestGateway,
    key: &str,
    id: &str,
    path: &str,
    bytes: Vec<u8>,
    mode: Option<&str>,
) -> (u16, Value) {
    let mut query = vec![("path", path)];
    if let Some(mode) = mode {
        query.push(("mode", mode));
    }
    let response = gw
        .http
        .put(files(gw, id, "/content"))
        .query(&query)
        .bearer_auth(key)
        .body(bytes)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn query(gw: &TestGateway, key: &str, id: &str, rest: &str, path: &str) -> (u16, Value) {
    let response = gw
        .http
        .get(files(gw, id, rest))
        .query(&[("path", path), ("depth", "2")])
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn stat(gw: &TestGateway, key: &str, id: &str, path: &str) -> (u16, Value) {
    let response = gw
        .http
        .get(files(gw, id, "/stat"))
        .query(&[("path", path)])
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn remove(gw: &TestGateway, key: &str, id: &str, path: &str) -> u16 {
    let response = gw
        .http
        .delete(files(gw, id, ""))
        .query(&[("path", path)])
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    response.status().as_u16()
}

async fn events(gw: &TestGateway, kind: &str) -> Vec<Value> {
    let pool = gw.pool().await;
    let rows: Vec<(Value,)> =
        sqlx::query_as("SELECT input FROM audit_events WHERE kind = $1 ORDER BY seq")
            .bind(kind)
            .fetch_all(&pool)
            .await
            .unwrap();
    rows.into_iter().map(|(input,)| input).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn bytes_round_trip_and_list_stat_mkdir_move_remove_are_audited() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let id = open(&gw, &key).await;

    let (status, dir) = gw
        .post(
            &key,
            &format!("/v1/sessions/{id}/files/mkdir"),
            &json!({"path": "/workspace/data/sub"}),
        )
        .await;
    assert_eq!(status, 200, "{dir}");
    assert_eq!(dir["kind"], "dir", "{dir}");

    // Every byte value, NULs and invalid UTF-8 included.
    let bytes: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let sha = hex::encode(sha2::Sha256::digest(&bytes));
    let path = "/workspace/data/./sub/../sub/bin.dat";
    let (status, written) = write(&gw, &key, &id, path, bytes.clone(), Some("640")).await;
    assert_eq!(status, 200, "{written}");
    assert_eq!(written["sha256"], sha);
    assert_eq!(written["entry"]["path"], "/workspace/data/sub/bin.dat");
    assert_eq!(written["entry"]["size"], 300_000);
    assert_eq!(written["entry"]["mode"], 0o640);

    let (status, back) = read(&gw, &key, &id, "/workspace/data/sub/bin.dat").await;
    assert_eq!(status, 200);
    assert!(back == bytes, "the bytes read back differ");

    // The program sees exactly those bytes, owned by its own user.
    let seen = cell(
        &gw,
        &key,
        &id,
        "import hashlib, os\np = '/workspace/data/sub/bin.dat'\n\
         (hashlib.sha256(open(p, 'rb').read()).hexdigest(), os.stat(p).st_uid == os.getuid())",
    )
    .await;
    assert_eq!(seen["result"], format!("('{sha}', True)"), "{seen}");

    // Replacing keeps the mode unless one is given.
    let (status, replaced) = write(
        &gw,
        &key,
        &id,
        "/workspace/data/sub/bin.dat",
        b"v2".to_vec(),
        None,
    )
    .await;
    assert_eq!(status, 200, "{replaced}");
    assert_eq!(replaced["entry"]["size"], 2);
    assert_eq!(replaced["entry"]["mode"], 0o640);

    let (status, listing) = query(&gw, &key, &id, "", "/workspace/data").await;
    assert_eq!(status, 200, "{listing}");
    let listed: Vec<(&str, &str)> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        listed,
        [
            ("/workspace/data/sub", "dir"),
            ("/workspace/data/sub/bin.dat", "file")
        ]
    );
    assert_eq!(listing["truncated"], false);

    // Each place is a file system of its own: a move between two is refused, within one done.
    let moving = format!("/v1/sessions/{id}/files/move");
    let across = json!({"from": "/workspace/data/sub/bin.dat", "to": "/tmp/moved.dat"});
    let (status, refused) = gw.post(&key, &moving, &across).await;
    assert_eq!(status, 400, "{refused}");
    let within = json!({"from": "/workspace/data/sub/bin.dat", "to": "/workspace/moved.dat"});
    let (status, moved) = gw.post(&key, &moving, &within).await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["path"], "/workspace/moved.dat");
    let (status, _) = stat(&gw, &key, &id, "/workspace/data/sub/bin.dat").await;
    assert_eq!(status, 404);
    let (status, entry) = stat(&gw, &key, &id, "/workspace/moved.dat").await;
    assert_eq!((status, entry["size"].clone()), (200, json!(2)), "{entry}");

    assert_eq!(remove(&gw, &key, &id, "/workspace/data").await, 204);
    assert_eq!(stat(&gw, &key, &id, "/workspace/data").await.0, 404);
    assert_eq!(remove(&gw, &key, &id, "/workspace/data").await, 404);

    // Another agent of the tenant, or of another tenant: as if the session did not exist.
    // A reviewer may read sessions but not their files.
    for other in [
        gw.key("agent", "acme").await,
        gw.key("agent", "globex").await,
    ] {
        assert_eq!(read(&gw, &other, &id, "/workspace/moved.dat").await.0, 404);
        assert_eq!(
            write(&gw, &other, &id, "/tmp/x", b"x".to_vec(), None)
                .await
                .0,
            404
        );
        assert_eq!(remove(&gw, &other, &id, "/workspace/moved.dat").await, 404);
    }
    let reviewer = gw.key("reviewer", "acme").await;
    assert_eq!(
        read(&gw, &reviewer, &id, "/workspace/moved.dat").await.0,
        403
    );
    assert_eq!(stat(&gw, &key, &id, "/workspace/moved.dat").await.0, 200);

    let written = events(&gw, "session.file_written").await;
    assert_eq!(written.len(), 2, "{written:?}");
    assert_eq!(written[0]["session_id"], id.as_str());
    assert_eq!(written[0]["path"], "/workspace/data/sub/bin.dat");
    assert_eq!(written[0]["bytes"], 300_000);
    assert_eq!(written[0]["sha256"], sha);
    assert_eq!(written[0]["mode"], 0o640);
    // Both moves were asked for (recorded before they are carried out); the second one ran.
    let moved = events(&gw, "session.file_moved").await;
    assert_eq!(moved.len(), 2, "{moved:?}");
    assert_eq!(moved[1]["from"], "/workspace/data/sub/bin.dat");
    assert_eq!(moved[1]["to"], "/workspace/moved.dat");
    // The second removal found nothing, but was asked for (recorded before it is carried out).
    let removed = events(&gw, "session.file_removed").await;
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert_eq!(removed[0]["path"], "/workspace/data");
    gw.assert_chain_verifies().await;

    // A closed session has no sandbox: 409, saying so.
    let (status, _) = gw.delete(&key, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200);
    let (status, body) = stat(&gw, &key, &id, "/workspace").await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("closed"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn traversal_planted_symlinks_fifos_oversize_and_a_busy_session_are_refused() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let id = open(&gw, &key).await;
    cell(
        &gw,
        &key,
        &id,
        "import os\n\
         os.makedirs('/tmp/victim')\n\
         open('/tmp/victim/keep', 'w').write('keep')\n\
         os.symlink('/etc', '/workspace/etc_link')\n\
         os.symlink('/etc/passwd', '/workspace/passwd_link')\n\
         os.symlink('/tmp/victim', '/workspace/victim_link')\n\
         os.symlink('/tmp/victim/new', '/workspace/dangling')\n\
         os.mkfifo('/workspace/fifo')",
    )
    .await;

    // Outside the places, spelled every way: refused before anything reaches the sandbox.
    for path in [
        "/etc/passwd",
        "/workspace/../etc/passwd",
        "/tmp/../../../etc/shadow",
        "/sandgate/init",
        "/run/sandgate/egress.sock",
        "workspace/relative",
        "/proc/1/environ",
    ] {
        let (status, _) = read(&gw, &key, &id, path).await;
        assert_eq!(status, 403, "{path}");
        let (status, body) = write(&gw, &key, &id, path, b"x".to_vec(), None).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert_eq!(body["error"]["code"], "forbidden", "{body}");
    }
    // Through the program's symlinks: refused, as the file or on the way.
    for path in [
        "/workspace/etc_link/passwd",
        "/workspace/passwd_link",
        "/workspace/victim_link/keep",
    ] {
        let (status, _) = read(&gw, &key, &id, path).await;
        assert_eq!(status, 403, "{path}");
    }
    for path in [
        "/workspace/victim_link/keep",
        "/workspace/victim_link/new",
        "/workspace/dangling",
        "/workspace/passwd_link",
    ] {
        let (status, body) = write(&gw, &key, &id, path, b"overwritten".to_vec(), None).await;
        assert_eq!(status, 403, "{path}: {body}");
    }
    assert_eq!(
        remove(&gw, &key, &id, "/workspace/victim_link/keep").await,
        403
    );
    let (status, _) = gw
        .post(
            &key,
            &format!("/v1/sessions/{id}/files/move"),
            &json!({"from": "/workspace/victim_link/keep", "to": "/workspace/stolen"}),
        )
        .await;
    assert_eq!(status, 403);
    let (status, _) = gw
        .post(
            &key,
            &format!("/v1/sessions/{id}/files/mkdir"),
            &json!({"path": "/workspace/victim_link/made"}),
        )
        .await;
    assert_eq!(status, 403);
    // A FIFO is no file, and does not hold the init.
    let (status, _) = read(&gw, &key, &id, "/workspace/fifo").await;
    assert_eq!(status, 400);
    // stat and list show a symlink as one; removing it removes the link only.
    let (status, link) = stat(&gw, &key, &id, "/workspace/etc_link").await;
    assert_eq!(status, 200, "{link}");
    assert_eq!(
        (link["kind"].as_str(), link["symlink_target"].as_str()),
        (Some("symlink"), Some("/etc"))
    );
    assert_eq!(remove(&gw, &key, &id, "/workspace/victim_link").await, 204);

    let untouched = cell(
        &gw,
        &key,
        &id,
        "import os\n(open('/tmp/victim/keep').read(), sorted(os.listdir('/tmp/victim')), \
         os.path.lexists('/workspace/victim_link'), os.path.exists('/workspace/stolen'))",
    )
    .await;
    assert_eq!(
        untouched["result"], "('keep', ['keep'], False, False)",
        "{untouched}"
    );

    // At the limit: written and read back whole. Over it: 413, nothing written or recorded.
    let limit: Vec<u8> = (0..16 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    let (status, body) = write(&gw, &key, &id, "/tmp/limit", limit.clone(), None).await;
    assert_eq!(status, 200, "{body}");
    let (status, back) = read(&gw, &key, &id, "/tmp/limit").await;
    assert_eq!(status, 200);
    assert!(
        back == limit,
        "16 MiB did not come back whole ({} bytes)",
        back.len()
    );
    let big = vec![b'x'; 16 * 1024 * 1024 + 1];
    let (status, body) = write(&gw, &key, &id, "/workspace/big", big, None).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(stat(&gw, &key, &id, "/workspace/big").await.0, 404);
    let recorded = events(&gw, "session.file_written").await;
    assert!(
        recorded
            .iter()
            .all(|event| event["path"] != "/workspace/big" && event["path"] != "/etc/passwd"),
        "{recorded:?}"
    );

    // While an execution runs: 409, and the session goes on.
    let (status, running) = gw
        .post(
            &key,
            &format!("/v1/sessions/{id}/executions"),
            &json!({"code": "import time\ntime.sleep(3)", "wait": false}),
        )
        .await;
    assert_eq!(status, 202, "{running}");
    let (status, body) = stat(&gw, &key, &id, "/workspace").await;
    assert_eq!(status, 409, "{body}");
    common::eventually(
        std::time::Duration::from_secs(30),
        "the cell ends",
        || async { stat(&gw, &key, &id, "/workspace").await.0 == 200 },
    )
    .await;
}
