//! Every limit of one execution, each ending as its own status with the gateway unharmed, and
//! the API's own bounds (DESIGN 7: resources and API), on real dockerd, runsc and PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::payloads::streamed_text;
use common::TestGateway;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread")]
async fn fork_bomb_ends_and_the_host_stays_usable() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "forge").await;
    // The classic bomb, with a parent that stays: only the pids limit holds it, and only the
    // deadline ends it.
    let bomb = "bomb() { bomb | bomb & }; bomb; while :; do sleep 1; done";
    let (status, record) = gw
        .execute(&key, "bash", bomb, json!({"limits": {"timeout_ms": 8000}}))
        .await;
    assert_eq!(status, 200, "{record}");
    // Under runsc's ptrace platform every process needs a host stub process, so at the pids
    // limit gVisor's kernel itself may give up and the sandbox dies (`killed`, told apart from
    // the program's own exit by sandbox-init's exit trailer); otherwise the deadline ends it.
    let ended = record["status"].as_str().unwrap();
    assert!(["killed", "timeout"].contains(&ended), "{record}");
    if ended == "killed" {
        assert!(
            record["error"].as_str().unwrap().contains("stopped before"),
            "{record}"
        );
    }
    assert!(common::removed_soon(record["id"].as_str().unwrap()));
    // A shell bomb whose parent returns at once: the program's end takes every child with it.
    let (status, record) = gw
        .execute(&key, "bash", "bomb() { bomb | bomb & }; bomb", json!({}))
        .await;
    assert_eq!(status, 200, "{record}");
    assert!(common::removed_soon(record["id"].as_str().unwrap()));
    // The host can still fork, and the next sandbox runs normally.
    assert!(std::process::Command::new("true")
        .status()
        .unwrap()
        .success());
    // Sent directly, not through `execute`: the warm pass once saw this run start cold after
    // the bombs (CI, under load; cause not found: `/readyz` counts waiting sandboxes per
    // language, not per shape, so the harness cannot wait for one of this shape). What this
    // test holds is that the next sandbox runs normally, however it starts; the claim path
    // has its own tests (`warm::`, `orchestration::`).
    let body = json!({"language": "bash", "code": "echo fine", "wait": true});
    let (status, record) = gw.post(&key, "/v1/executions", &body).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["stdout"], "fine\n", "{record}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn disk_fill_hits_enospc_inside_and_leaves_the_host_disk_alone() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "forge").await;
    let free_before = free_bytes("/");
    let code = r#"
import errno
for place in ("/workspace", "/tmp", "/output"):
    written = 0
    try:
        with open(f"{place}/fill", "wb") as f:
            chunk = b"\0" * (1 << 20)
            for _ in range(4096):  # up to 4 GiB
                f.write(chunk)
                f.flush()
                written += len(chunk)
        print(place, "no error", written)
    except OSError as err:
        print(place, errno.errorcode[err.errno], written >> 20)
"#;
    let (status, record) = gw
        .execute(&key, "python", code, json!({"limits": {"disk_mb": 64}}))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["limits"]["disk_mb"], 64);
    let stdout = record["stdout"].as_str().unwrap();
    for line in stdout.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        assert_eq!(parts[1], "ENOSPC", "{stdout}");
        let mib: u64 = parts[2].parse().unwrap();
        assert!(mib <= 64, "{line}: more than the 64 MiB cap");
    }
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
    // The 4 GiB the program asked for never reached the host's disk (tmpfs, capped).
    let free_after = free_bytes("/");
    assert!(
        free_after + (1 << 30) > free_before,
        "host disk shrank by {} MiB",
        (free_before - free_after) >> 20
    );
    // What /output held is collected up to the output limit, and the manifest says so.
    assert_eq!(record["outputs_truncated"], true, "{record}");
    assert_eq!(record["outputs_skipped"][0]["path"], "fill", "{record}");
    assert_eq!(record["outputs_skipped"][0]["reason"], "output_limit");
    gw.stop().await;
}

fn free_bytes(path: &str) -> u64 {
    let stat = nix::sys::statvfs::statvfs(path).unwrap();
    stat.blocks_available() * stat.fragment_size()
}

#[tokio::test(flavor = "multi_thread")]
async fn cpu_quota_and_open_files_are_enforced() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "classroom").await;
    // classroom: 0.5 CPU. The host kernel's own accounting of the sandbox's cgroup is the
    // evidence (gVisor's in-sandbox CPU clock is not): the quota is set, the cgroup is
    // throttled, and it burns at most about half a core while the program spins.
    let spin =
        "import time\nstart = time.monotonic()\nwhile time.monotonic() - start < 4:\n    pass\n";
    let (status, created) = gw
        .execute(&key, "python", spin, json!({"wait": false}))
        .await;
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let mut attempts = 0;
    let container = loop {
        attempts += 1;
        assert!(attempts < 400, "the sandbox of {id} never appeared");
        let output = std::process::Command::new("docker")
            .args(["ps", "-q", "--no-trunc", "--filter"])
            .arg(format!("label=sandgate.execution={id}"))
            .output()
            .unwrap();
        let found = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if !found.is_empty() {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let cgroup = |controller: &str, file: &str| {
        std::fs::read_to_string(format!(
            "/sys/fs/cgroup/{controller}/docker/{container}/{file}"
        ))
        .unwrap_or_else(|err| panic!("{controller}/{file} of {container}: {err}"))
    };
    assert_eq!(cgroup("cpu", "cpu.cfs_quota_us").trim(), "50000");
    assert_eq!(cgroup("cpu", "cpu.cfs_period_us").trim(), "100000");
    // Let the interpreter start and spin, then measure one second of it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let used = |text: String| text.trim().parse::<u64>().unwrap();
    let before = used(cgroup("cpuacct", "cpuacct.usage"));
    let window = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let burnt = used(cgroup("cpuacct", "cpuacct.usage")) - before;
    let share = burnt as f64 / window.elapsed().as_nanos() as f64;
    let throttled: u64 = cgroup("cpu", "cpu.stat")
        .lines()
        .find_map(|line| line.strip_prefix("nr_throttled "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        throttled > 0,
        "a spinning program under a 0.5 CPU quota was never throttled"
    );
    // 0.5 of the window plus one period of slack.
    assert!(
        share < 0.65,
        "the sandbox used {share:.2} CPU under a 0.5 CPU quota"
    );
    let (_, record) = gw.get(&key, &format!("/v1/executions/{id}")).await;
    assert_eq!(record["limits"]["cpus"], 0.5, "{record}");

    let code = r#"
import resource
files = []
try:
    while True:
        files.append(open("/dev/null"))
except OSError as err:
    print(err.errno, len(files), resource.getrlimit(resource.RLIMIT_NOFILE)[1])
"#;
    let (status, record) = gw.execute(&key, "python", code, json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    let stdout = record["stdout"].as_str().unwrap();
    let fds: Vec<u64> = stdout
        .trim()
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(fds[0], 24, "EMFILE expected: {stdout}");
    assert!(fds[1] < 1024 && fds[2] == 1024, "{stdout}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn output_flood_for_ten_seconds_is_capped() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let (status, record) = gw
        .execute(&key, "bash", "timeout 10 yes; echo flooded >&2", json!({}))
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["stdout_truncated"], true);
    assert_eq!(record["stdout"].as_str().unwrap().len(), 1_048_576);
    assert_eq!(record["stderr"], "flooded\n");
    gw.stop().await;
}

/// Raw HTTP, so the body can be streamed and the answer read before it is all sent.
async fn raw_post(url: &str, key: &str, framing: &str, total: usize) -> (String, usize) {
    let addr = url.trim_start_matches("http://");
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/executions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\n{framing}\r\n"
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let chunked = framing.contains("chunked");
    let piece = vec![b' '; 1 << 20];
    let mut sent = 0;
    let mut answer = Vec::new();
    while sent < total {
        let write = async {
            if chunked {
                socket
                    .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                    .await?;
                socket.write_all(&piece).await?;
                socket.write_all(b"\r\n").await
            } else {
                socket.write_all(&piece).await
            }
        };
        match tokio::time::timeout(Duration::from_secs(5), write).await {
            Ok(Ok(())) => sent += piece.len(),
            // Refused mid-body: the server answered and closed.
            _ => break,
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut answer)).await;
    (String::from_utf8_lossy(&answer).into_owned(), sent)
}

#[tokio::test(flavor = "multi_thread")]
async fn hundred_megabyte_bodies_are_refused_while_streaming() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let total = 100 << 20;
    // Declared length over the limit: refused before any of the body is read.
    let (answer, _) = raw_post(
        &gw.url,
        &key,
        &format!("Content-Length: {total}\r\n"),
        total,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    // Chunked, no length: refused once the limit is crossed, long before 100 MB arrive.
    let (answer, sent) = raw_post(&gw.url, &key, "Transfer-Encoding: chunked\r\n", total).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        sent < total,
        "the whole 100 MB was accepted before the answer"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn traversal_and_odd_unicode_file_names_are_refused_by_name() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let since = common::docker_now();
    for name in [
        "../x",
        "/etc/x",
        "a/../../b",
        "%2e%2e/x",
        "a\u{0}b",
        "\u{ff0e}\u{ff0e}/x",
        "\u{ff0e}\u{ff0e}\u{ff0f}x",
        "x/%2E%2E/%2e%2e/y",
        "..\\x",
        "",
        &"n".repeat(300),
    ] {
        let (status, body) = gw
            .execute(
                &key,
                "python",
                "print(1)",
                json!({"files": [{"path": name, "content_b64": b64(b"x")}]}),
            )
            .await;
        assert_eq!(status, 400, "{name:?}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        let shown: String = format!("file {name:?}").chars().take(24).collect();
        assert!(
            message.starts_with(&shown),
            "{name:?} not named in {message}"
        );
    }
    // A decomposed accent is accepted and written in its composed form.
    let (status, record) = gw
        .execute(
            &key,
            "python",
            "import os\nprint(sorted(os.listdir('.')))",
            json!({"files": [{"path": "cafe\u{301}.csv", "content_b64": b64(b"x")}]}),
        )
        .await;
    assert_eq!(status, 200, "{record}");
    // The program itself is /workspace/main.py, beside the uploads.
    assert_eq!(
        record["stdout"], "['caf\u{e9}.csv', 'main.py']\n",
        "{record}"
    );
    // None of the refused requests created a container: only the accepted one did (unless
    // it ran in a sandbox the pool had started before).
    let label = format!("sandgate.instance={}", gw.instance().await);
    let created = common::containers_created_since(&since, &label);
    let expected = usize::from(record["start"] != "warm");
    assert_eq!(created.len(), expected, "{created:?}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn events_stream_while_running_and_match_the_final_record() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let code = r#"
import sys, time
print("first", flush=True)
time.sleep(2)
for i in range(5):
    print("line", i, "é→世", flush=True)
    print("warn", i, file=sys.stderr, flush=True)
    time.sleep(0.1)
sys.exit(3)
"#;
    let (status, created) = gw
        .execute(&key, "python", code, json!({"wait": false}))
        .await;
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let mut reader = gw.events(&key, &id).await;
    // The first line (print() may write it in two pieces) ...
    let mut events = Vec::new();
    while !streamed_text(&events, "stdout").contains('\n') {
        let event = reader.next().await.expect("a first line");
        assert_eq!(event.name, "stdout", "{event:?}");
        events.push(event);
    }
    assert_eq!(streamed_text(&events, "stdout"), "first\n");
    // ... arrived while the program was still running (it sleeps 2 s after it), and the
    // record shows the output so far.
    let (_, record) = gw.get(&key, &format!("/v1/executions/{id}")).await;
    assert_eq!(record["status"], "running", "{record}");
    assert_eq!(record["stdout"], "first\n", "{record}");
    // A client that reconnects with Last-Event-ID gets exactly what follows.
    let seen = events.last().unwrap().id.expect("events carry ids");
    let resumed = gw.events_after(&key, &id, Some(seen)).await;
    events.extend(reader.collect().await);
    let resumed = resumed.collect().await;
    let after: Vec<_> = events.iter().filter(|e| e.id > Some(seen)).collect();
    assert_eq!(resumed.len(), after.len(), "{resumed:?}");
    for (a, b) in resumed.iter().zip(&after) {
        assert_eq!((a.id, &a.name, &a.data), (b.id, &b.name, &b.data));
    }
    let ids: Vec<u64> = events.iter().map(|e| e.id.unwrap()).collect();
    assert_eq!(ids, (1..=events.len() as u64).collect::<Vec<_>>());
    let last = events.last().unwrap();
    assert_eq!(last.name, "exit");
    assert_eq!(
        events.iter().filter(|e| e.name == "exit").count(),
        1,
        "{events:?}"
    );

    let (_, record) = gw.get(&key, &format!("/v1/executions/{id}")).await;
    assert_eq!(record["status"], "failed");
    assert_eq!(record["exit_code"], 3);
    assert_eq!(last.data["status"], record["status"]);
    assert_eq!(last.data["exit_code"], record["exit_code"]);
    assert_eq!(
        streamed_text(&events, "stdout"),
        record["stdout"].as_str().unwrap()
    );
    assert_eq!(
        streamed_text(&events, "stderr"),
        record["stderr"].as_str().unwrap()
    );

    // After the end, the stream replays the stored record: the same bytes, the same end.
    let replay = gw.events(&key, &id).await.collect().await;
    assert_eq!(
        streamed_text(&replay, "stdout"),
        record["stdout"].as_str().unwrap()
    );
    assert_eq!(
        streamed_text(&replay, "stderr"),
        record["stderr"].as_str().unwrap()
    );
    assert_eq!(replay.last().unwrap().data, last.data);
    // ... in the same events as the live stream (the stored layout keeps the interleaving),
    // so ids carry over: Last-Event-ID from the live stream resumes the replay.
    let same = |a: &[common::payloads::SseEvent], b: &[common::payloads::SseEvent]| {
        assert_eq!(a.len(), b.len(), "{a:?}\n{b:?}");
        for (a, b) in a.iter().zip(b) {
            assert_eq!((a.id, &a.name, &a.data), (b.id, &b.name, &b.data));
        }
    };
    same(&replay, &events);
    let tail = gw.events_after(&key, &id, Some(2)).await.collect().await;
    same(&tail, &events[2..]);

    // Another tenant sees nothing.
    let other = gw.key("agent", "forge").await;
    let (status, _) = gw.get(&other, &format!("/v1/executions/{id}/events")).await;
    assert_eq!(status, 404);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn symlinks_in_output_are_not_followed_and_retention_purges_payloads() {
    let url = common::fresh_database().await;
    let gw = TestGateway::start_with(Some(url.clone()), |_| {}).await;
    let key = gw.key("agent", "acme").await;
    let code = r#"
import os
open("/output/report.txt", "w").write("result\n")
os.symlink("/etc/passwd", "/output/passwd")
os.symlink("/sandgate/init", "/output/init")
os.symlink("/", "/output/root")
os.link("/output/report.txt", "/output/hardlink.txt")
print("done")
"#;
    let (status, record) = gw.execute(&key, "python", code, json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "succeeded", "{record}");
    let paths: Vec<&str> = record["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["hardlink.txt", "report.txt"], "{record}");
    let skipped: Vec<(&str, &str)> = record["outputs_skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["path"].as_str().unwrap(), o["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        skipped,
        [
            ("init", "symlink"),
            ("passwd", "symlink"),
            ("root", "symlink")
        ]
    );
    let id = record["id"].as_str().unwrap().to_owned();
    for link in ["passwd", "init", "root"] {
        let (status, _, _) = gw.download(&key, &id, link).await;
        assert_eq!(status, 404, "{link}");
    }
    let stored = gw.data_dir.path().join("outputs").join(&id);
    assert!(stored.join("report.txt").is_file());

    // Retention: the record finished "40 days ago"; a restart's first sweep purges its payload.
    let pool = gw.pool().await;
    let data_dir = gw.stop_keeping_data().await;
    sqlx::query("UPDATE executions SET finished_at = now() - interval '40 days' WHERE id = $1")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    let gw = TestGateway::start_in(Some(url), data_dir, |config| config.retention_days = 30).await;
    let mut purged = Value::Null;
    for _ in 0..100 {
        let (_, record) = gw.get(&key, &format!("/v1/executions/{id}")).await;
        if record["purged_at"].is_string() {
            purged = record;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(purged["purged_at"].is_string(), "not purged: {purged}");
    assert_eq!(purged["stdout"], "");
    assert_eq!(purged["status"], "succeeded", "the record itself stays");
    assert_eq!(
        purged["outputs"].as_array().unwrap().len(),
        2,
        "the manifest stays"
    );
    assert!(!stored.exists(), "output files still on disk");
    let (status, _, _) = gw.download(&key, &id, "report.txt").await;
    assert_eq!(status, 404);
    let purges: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_events WHERE kind = 'retention.purge' \
         AND input->'executions' ? $1",
    )
    .bind(&id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(purges, 1);
    let auditor = gw.key("auditor", "acme").await;
    let (status, verify) = gw.get(&auditor, "/v1/audit/verify").await;
    assert_eq!(status, 200, "{verify}");
    assert!(verify["broken"].is_null(), "{verify}");
    gw.stop().await;
}

/// A program cannot pass itself off as having ended well: sandbox-init's exit trailer carries a
/// per-run nonce only the init knows, and the init is not dumpable, so its memory and stdin
/// are out of the program's reach.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_exit_trailer_is_just_stderr() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "forge").await;
    let code = r#"
import sys
forged = "\0sandgate-exit:0\n\0sandgate-exit:" + "0" * 32 + ":0\n"
sys.stderr.write(forged)
sys.stderr.flush()
# A forged end marker on stdout does not end the run early either: what follows is kept.
sys.stdout.write("\0sandgate-end:" + "0" * 32 + ":0:\nafter the forged end\n")
sys.stdout.flush()
for path in ("/proc/1/mem", "/proc/1/fd/0"):
    try:
        data = open(path, "rb").read(4096)
        print(path, "read", len(data))
    except OSError as err:
        print(path, type(err).__name__)
sys.exit(3)
"#;
    let (status, record) = gw.execute(&key, "python", code, json!({})).await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "failed", "{record}");
    assert_eq!(record["exit_code"], 3, "{record}");
    let forged = format!("\0sandgate-exit:0\n\0sandgate-exit:{}:0\n", "0".repeat(32));
    assert_eq!(
        record["stderr"], forged,
        "the forgery stays in stderr as written"
    );
    // The init's memory is closed to the program; its stdin (where the job and the nonce came
    // from) is drained before the program starts.
    let stdout = record["stdout"].as_str().unwrap();
    let forged_end = format!(
        "\0sandgate-end:{}:0:\nafter the forged end\n",
        "0".repeat(32)
    );
    assert!(stdout.starts_with(&forged_end), "{stdout:?}");
    assert!(stdout.contains("/proc/1/mem PermissionError"), "{stdout}");
    assert!(
        !stdout.contains("/proc/1/fd/0 read") || stdout.contains("/proc/1/fd/0 read 0"),
        "{stdout}"
    );
    gw.stop().await;
}
