//! The real `sandgate` binary, as a user runs it: `serve` with the embedded default database,
//! `keys create` against the same instance, one execution, and a clean shutdown that stops the
//! private PostgreSQL.

use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

fn sandgate(data_dir: &std::path::Path, listen: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandgate"));
    command
        .env_remove("SANDGATE_DATABASE_URL")
        .env("SANDGATE_DATA_DIR", data_dir)
        .env("SANDGATE_LISTEN", listen)
        .env(
            "SANDGATE_POLICY_DIR",
            common::workspace_root().join("policies"),
        )
        .env("SANDGATE_SANDBOX_INIT", common::sandbox_init())
        // No pool unless a test asks for one: preloading pandas costs seconds of CPU.
        .env("SANDGATE_WARM_POOL", "{}");
    command
}

/// A data directory the embedded cluster's `postgres` user can enter, and a free loopback port.
fn data_dir_and_listen() -> (tempfile::TempDir, String) {
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        data.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    (data, format!("127.0.0.1:{port}"))
}

/// `sandgate serve`, once it answers `/healthz`.
async fn serve(
    data: &std::path::Path,
    listen: &str,
    http: &reqwest::Client,
) -> std::process::Child {
    serve_with_pool(data, listen, http, "{}").await
}

/// `sandgate serve` with `SANDGATE_WARM_POOL` set to `pool`.
async fn serve_with_pool(
    data: &std::path::Path,
    listen: &str,
    http: &reqwest::Client,
    pool: &str,
) -> std::process::Child {
    let mut server = sandgate(data, listen)
        .env("SANDGATE_WARM_POOL", pool)
        .arg("serve")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_healthy(http, &format!("http://{listen}"), &mut server).await;
    server
}

/// SIGTERM, then the exit status.
async fn terminate(mut server: std::process::Child) -> std::process::ExitStatus {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap()
        .unwrap()
}

/// `GET url` with `key`, as JSON.
async fn get_json(http: &reqwest::Client, url: &str, key: &str) -> serde_json::Value {
    http.get(url)
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `sandgate keys create`: the key is the last line of stdout.
fn create_key(data: &std::path::Path, listen: &str, role: &str, tenant: &str) -> String {
    let output = sandgate(data, listen)
        .args(["keys", "create", "--role", role, "--tenant", tenant])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let key = stdout.lines().last().unwrap().trim().to_owned();
    assert!(key.starts_with("sgk_"), "{stdout}");
    key
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_keys_execute_and_shut_down_with_embedded_postgres() {
    common::require_docker();
    let (data, listen) = data_dir_and_listen();
    let http = reqwest::Client::new();
    let base = format!("http://{listen}");
    let server = serve(data.path(), &listen, &http).await;
    let key = create_key(data.path(), &listen, "agent", "acme");

    let response = http
        .post(format!("{base}/v1/executions"))
        .bearer_auth(&key)
        .json(&json!({"language": "python", "code": "print(6*7)", "wait": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["stdout"], "42\n", "{body}");

    // SIGHUP reloads the policy directory.
    let admin = create_key(data.path(), &listen, "admin", "ops");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let mut loaded_by = serde_json::Value::Null;
    for _ in 0..100 {
        let policy = get_json(&http, &format!("{base}/v1/policy"), &admin).await;
        loaded_by = policy["loaded_by"].clone();
        if loaded_by == "sighup" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(loaded_by, "sighup", "SIGHUP did not reload the policy");

    // Only the hash of the key is stored.
    let pg_data = data.path().join("pg/data");
    assert!(
        pg_data.join("postmaster.pid").exists(),
        "embedded PostgreSQL is running"
    );
    let dump = Command::new("grep")
        .args(["-r", "-l", &key])
        .arg(&pg_data)
        .output()
        .unwrap();
    assert!(
        dump.stdout.is_empty(),
        "the key itself is stored in the database files"
    );

    let status = terminate(server).await;
    assert!(status.success(), "sandgate serve exited with {status}");
    assert!(
        !pg_data.join("postmaster.pid").exists(),
        "embedded PostgreSQL still running after shutdown"
    );
}

async fn wait_healthy(http: &reqwest::Client, base: &str, server: &mut std::process::Child) {
    for _ in 0..600 {
        if let Ok(Some(status)) = server.try_wait() {
            panic!("sandgate serve exited: {status}");
        }
        if let Ok(response) = http.get(format!("{base}/healthz")).send().await {
            if response.status().is_success() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("sandgate serve did not come up");
}

/// kill -9 of the gateway mid-execution, then a restart: no container is left behind and the
/// record says what happened.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_execution_then_restart_leaves_no_container_and_a_truthful_record() {
    common::require_docker();
    let (data, listen) = data_dir_and_listen();
    let base = format!("http://{listen}");
    let http = reqwest::Client::new();
    let mut server = serve(data.path(), &listen, &http).await;
    let key = create_key(data.path(), &listen, "agent", "acme");

    let created: serde_json::Value = http
        .post(format!("{base}/v1/executions"))
        .bearer_auth(&key)
        .json(&json!({"language": "bash", "code": "sleep 25", "wait": false}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    let mut started = false;
    for _ in 0..200 {
        if !common::containers_of(&id).is_empty() {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started, "the sandbox never started");

    server.kill().unwrap();
    server.wait().unwrap();
    assert!(
        !common::containers_of(&id).is_empty(),
        "the container outlives the killed gateway"
    );

    let server = serve(data.path(), &listen, &http).await;
    let mut record = serde_json::Value::Null;
    for _ in 0..200 {
        record = get_json(&http, &format!("{base}/v1/executions/{id}"), &key).await;
        if record["status"] == "error" && common::containers_of(&id).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(record["status"], "error", "{record}");
    assert!(record["finished_at"].is_string(), "{record}");
    assert!(common::removed_soon(&id), "container left behind");
    // Its /output area (a tmpfs mounted on the host) is gone too.
    assert!(!data.path().join("scratch").join(&id).exists());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(&id), "the /output mount of {id} is left");

    let status = terminate(server).await;
    assert!(status.success(), "{status}");
    assert!(
        !data.path().join("pg/data/postmaster.pid").exists(),
        "the restarted gateway adopted and stopped the embedded PostgreSQL"
    );
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// `sandgate exec` prints output as it arrives, uploads files, downloads outputs and exits with
/// the program's code; and the gateway's memory stays flat under 10 s of `yes`.
#[tokio::test(flavor = "multi_thread")]
async fn exec_client_streams_and_gateway_memory_stays_flat_under_a_flood() {
    use std::io::{BufRead, BufReader, Read};
    common::require_docker();
    let (data, listen) = data_dir_and_listen();
    let base = format!("http://{listen}");
    let http = reqwest::Client::new();
    let server = serve(data.path(), &listen, &http).await;
    let key = create_key(data.path(), &listen, "agent", "acme");

    let work = tempfile::tempdir().unwrap();
    let program = work.path().join("job.py");
    std::fs::write(
        &program,
        "import sys, time\nprint('start', flush=True)\ntime.sleep(2)\n\
         rows = open('numbers.csv').read().split()\nprint(sum(map(int, rows)))\n\
         open('/output/sum.txt', 'w').write('ok')\nprint('bye', file=sys.stderr)\nsys.exit(3)\n",
    )
    .unwrap();
    let csv = work.path().join("input.csv");
    std::fs::write(&csv, "1\n2\n3\n").unwrap();
    let outputs = work.path().join("out");
    let mut child = sandgate(data.path(), &listen)
        .arg("exec")
        .arg("--file")
        .arg(&program)
        .arg("--file-in")
        .arg(format!("{}=numbers.csv", csv.display()))
        .arg("--output-dir")
        .arg(&outputs)
        .env("SANDGATE_KEY", &key)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (first_out, first_err, mut stdout, mut stderr) = tokio::task::spawn_blocking(move || {
        let (mut stdout, mut stderr) = (stdout, stderr);
        let mut err = String::new();
        stderr.read_line(&mut err).unwrap();
        let mut out = String::new();
        stdout.read_line(&mut out).unwrap();
        (out, err, stdout, stderr)
    })
    .await
    .unwrap();
    assert_eq!(first_out, "start\n");
    let id = first_err
        .trim()
        .strip_prefix("sandgate: execution ")
        .unwrap_or_else(|| panic!("{first_err}"))
        .to_owned();
    // The first line came while the program was still running (it sleeps 2 s after it).
    let record = get_json(&http, &format!("{base}/v1/executions/{id}"), &key).await;
    assert_eq!(record["status"], "running", "{record}");
    let (status, rest_out, rest_err) = tokio::task::spawn_blocking(move || {
        let mut out = String::new();
        stdout.read_to_string(&mut out).unwrap();
        let mut err = String::new();
        stderr.read_to_string(&mut err).unwrap();
        (child.wait().unwrap(), out, err)
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(3), "{rest_err}");
    assert_eq!(rest_out, "6\n");
    assert!(rest_err.starts_with("bye\n"), "{rest_err}");
    assert_eq!(
        std::fs::read_to_string(outputs.join("sum.txt")).unwrap(),
        "ok"
    );

    // 10 s of `yes`: the gateway keeps 1 MiB of it and its memory stays flat.
    let pid = server.id();
    let baseline = rss_bytes(pid);
    let flood = http
        .post(format!("{base}/v1/executions"))
        .bearer_auth(&key)
        .json(&json!({"language": "bash", "code": "timeout 10 yes", "wait": true}))
        .send();
    let sampler = async {
        let mut peak = 0;
        for _ in 0..150 {
            peak = peak.max(rss_bytes(pid));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        peak
    };
    let (response, peak) = tokio::join!(flood, sampler);
    let body: serde_json::Value = response.unwrap().json().await.unwrap();
    assert_eq!(body["stdout_truncated"], true, "{body}");
    let growth = peak.saturating_sub(baseline);
    assert!(
        growth < 64 << 20,
        "gateway RSS grew by {} MiB under the flood (baseline {} MiB)",
        growth >> 20,
        baseline >> 20
    );
    let status = terminate(server).await;
    assert!(status.success(), "{status}");
}

/// `sandgate exec --output-dir` writes only new regular files, refuses dot-files and never
/// replaces what is there, unless asked (`--allow-dotfiles`, `--force`); it prints what it wrote
/// and what it refused (issue 15, item 11: a planted `.git/config` ran a command at the next
/// `git status`). `keys list|revoke` and the unknown-tenant warning, as the binary prints them.
#[tokio::test(flavor = "multi_thread")]
async fn exec_writes_only_new_regular_files_and_keys_can_be_revoked() {
    common::require_docker();
    let (data, listen) = data_dir_and_listen();
    let http = reqwest::Client::new();
    let server = serve(data.path(), &listen, &http).await;
    let key = create_key(data.path(), &listen, "agent", "acme");
    let work = tempfile::tempdir().unwrap();
    let program = work.path().join("plant.py");
    std::fs::write(
        &program,
        "import os\nos.makedirs('/output/.git')\n\
         open('/output/.git/config', 'w').write('[core]\\n\\tfsmonitor = touch /tmp/pwned\\n')\n\
         open('/output/report.txt', 'w').write('theirs')\n\
         os.makedirs('/output/notes')\nopen('/output/notes/a.txt', 'w').write('a')\n",
    )
    .unwrap();
    let out = work.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("report.txt"), "mine").unwrap();
    let exec = |extra: &[&str]| {
        sandgate(data.path(), &listen)
            .arg("exec")
            .arg("--file")
            .arg(&program)
            .arg("--output-dir")
            .arg(&out)
            .args(extra)
            .env("SANDGATE_KEY", &key)
            .output()
            .unwrap()
    };
    // The gateway is another process: blocking here holds nothing it needs.
    let first = exec(&[]);
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(out.join("report.txt")).unwrap(),
        "mine"
    );
    assert!(
        !out.join(".git").exists(),
        "a dot-directory was written: {stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("notes/a.txt")).unwrap(),
        "a"
    );
    assert!(
        stderr.contains("wrote") && stderr.contains("notes/a.txt"),
        "{stderr}"
    );
    assert!(
        stderr.contains("\".git/config\"") && stderr.contains("--allow-dotfiles"),
        "{stderr}"
    );
    assert!(
        stderr.contains("report.txt") && stderr.contains("--force"),
        "{stderr}"
    );

    let second = exec(&["--force", "--allow-dotfiles"]);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(out.join("report.txt")).unwrap(),
        "theirs"
    );
    assert!(out.join(".git/config").is_file(), "{stderr}");
    // notes/a.txt exists from the first run: replaced, as asked.
    assert!(stderr.contains("notes/a.txt"), "{stderr}");

    // Keys from the command line: an unknown tenant warns; list shows last use; revoke refuses.
    let made = sandgate(data.path(), &listen)
        .args([
            "keys",
            "create",
            "--role",
            "agent",
            "--tenant",
            "nosuchtenant",
        ])
        .output()
        .unwrap();
    assert!(made.status.success());
    let warned = String::from_utf8_lossy(&made.stderr);
    assert!(
        warned.contains("warning: tenant nosuchtenant is not in the policy data"),
        "{warned}"
    );
    let key_id = format!("key_{}", &key[4..20]);
    let listed = sandgate(data.path(), &listen)
        .args(["keys", "list"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let row = listed
        .lines()
        .find(|line| line.starts_with(&key_id))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(
        row.contains("\tactive\t") && !row.ends_with("\t-"),
        "used, so a last use: {row}"
    );
    let revoked = sandgate(data.path(), &listen)
        .args(["keys", "revoke", &key_id])
        .output()
        .unwrap();
    assert!(
        revoked.status.success(),
        "{}",
        String::from_utf8_lossy(&revoked.stderr)
    );
    let base = format!("http://{listen}");
    let answer = http
        .get(format!("{base}/v1/executions"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(
        answer.status().as_u16(),
        401,
        "a revoked key is refused at once"
    );
    let status = terminate(server).await;
    assert!(status.success(), "{status}");
}

/// The shell commands of README.md's "Try it" section, in order, as one script.
fn readme_try_it() -> String {
    let readme = std::fs::read_to_string(common::workspace_root().join("README.md")).unwrap();
    let section = readme
        .split("\n## Try it\n")
        .nth(1)
        .expect("README.md has a \"## Try it\" section")
        .split("\n## ")
        .next()
        .unwrap();
    let mut script = String::new();
    for block in section.split("```sh\n").skip(1) {
        script.push_str(block.split("```").next().unwrap());
    }
    assert!(script.contains("sandgate exec"), "{script}");
    script
}

/// README.md's "Try it", run as written (only the address changed) by `bash -e`, from a clone
/// under a private directory (mode 0700, like `/root` or `mktemp -d`): `sandgate serve` and
/// `keys create` with the default `data_dir` (`.sandgate` in the clone), whose embedded
/// PostgreSQL then lives where its `postgres` user can reach it; `curl`; and `sandgate exec`
/// with the shipped `examples/`.
#[tokio::test(flavor = "multi_thread")]
async fn readme_try_it_runs_as_written_from_a_clone_under_a_private_directory() {
    common::require_docker();
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        home.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let clone = home.path().join("sandgate");
    std::fs::create_dir_all(clone.join("target/release")).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_sandgate"),
        clone.join("target/release/sandgate"),
    )
    .unwrap();
    let copied = Command::new("cp")
        .arg("-r")
        .arg(common::workspace_root().join("examples"))
        .arg(&clone)
        .status()
        .unwrap();
    assert!(copied.success());
    let (_unused, listen) = data_dir_and_listen();
    let in_clone = |program: &std::path::Path| {
        let mut command = Command::new(program);
        command
            .current_dir(&clone)
            .env_remove("SANDGATE_DATABASE_URL")
            .env_remove("SANDGATE_DATA_DIR")
            .env_remove("SANDGATE_KEY")
            .env("SANDGATE_LISTEN", &listen)
            .env(
                "SANDGATE_POLICY_DIR",
                common::workspace_root().join("policies"),
            )
            .env("SANDGATE_SANDBOX_INIT", common::sandbox_init());
        command
    };
    let http = reqwest::Client::new();
    let mut server = in_clone(&clone.join("target/release/sandgate"))
        .arg("serve")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_healthy(&http, &format!("http://{listen}"), &mut server).await;

    let script = readme_try_it().replace("127.0.0.1:8080", &listen);
    let run = in_clone(std::path::Path::new("bash"))
        .args(["-euo", "pipefail", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "{script}\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(stdout.contains("\"status\":\"succeeded\""), "{stdout}");
    assert!(stdout.contains("\"stdout\":\"42\\n\""), "{stdout}");
    assert!(stdout.contains("north    17 units"), "{stdout}");
    assert!(
        stdout.contains("region,units,amount"),
        "cat out/summary.csv: {stdout}"
    );

    let status = terminate(server).await;
    assert!(status.success(), "sandgate serve exited with {status}");
    let data_dir = clone.join(".sandgate");
    let relocated = gateway::database::embedded::relocated_cluster_dir(&data_dir);
    if nix::unistd::Uid::effective().is_root() {
        assert!(
            relocated.join("data/PG_VERSION").exists(),
            "as root, the cluster of a data_dir postgres cannot enter lives in {}",
            relocated.display()
        );
        assert!(
            !relocated.join("data/postmaster.pid").exists(),
            "stopped on shutdown"
        );
        std::fs::remove_dir_all(&relocated).unwrap();
    }
}

/// `sandgate exec --help` shows `--key` as optional (SANDGATE_KEY works), describes every
/// option and lists the languages; without a key the error names SANDGATE_KEY; an unknown
/// `SANDGATE_*` variable is a warning; logs on a pipe carry no ANSI colours.
#[test]
fn exec_help_and_errors_say_what_to_do() {
    let help = Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(["exec", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let usage = help
        .lines()
        .find(|line| line.starts_with("Usage:"))
        .unwrap();
    assert!(!usage.contains("--key"), "--key shown as required: {usage}");
    assert!(help.contains("SANDGATE_KEY"), "{help}");
    assert!(help.contains("--lang <python|bash>"), "{help}");
    let timeout = help
        .lines()
        .find(|line| line.contains("--timeout-ms"))
        .unwrap();
    assert!(timeout.contains("milliseconds"), "{timeout}");

    let run = Command::new(env!("CARGO_BIN_EXE_sandgate"))
        .args(["exec", "--file", "-"])
        .env_remove("SANDGATE_KEY")
        .env("SANDGATE_MAX_CONCURENT", "4")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!run.status.success());
    let stderr = String::from_utf8(run.stderr).unwrap();
    assert!(stderr.contains("set SANDGATE_KEY"), "{stderr}");
    assert!(
        stderr.contains("SANDGATE_MAX_CONCURENT is set but sandgate reads no such variable"),
        "{stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI escapes on a pipe: {stderr:?}"
    );
}

/// This instance's pooled sandboxes (running or not).
fn pooled_containers(data: &std::path::Path) -> Vec<String> {
    let instance = std::fs::read_to_string(data.join("instance")).unwrap();
    let output = Command::new("docker")
        .args([
            "ps",
            "-a",
            "-q",
            "--filter",
            "label=sandgate.pool",
            "--filter",
            &format!("label=sandgate.instance={}", instance.trim()),
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// kill -9 of the gateway with sandboxes waiting in its pool, then a restart: nothing pooled
/// survives it.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_with_the_pool_up_then_restart_leaves_no_pooled_sandbox() {
    common::require_docker();
    let (data, listen) = data_dir_and_listen();
    let http = reqwest::Client::new();
    let mut server = serve_with_pool(data.path(), &listen, &http, "{bash: 2}").await;
    let mut pooled = Vec::new();
    for _ in 0..600 {
        pooled = pooled_containers(data.path());
        if pooled.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(pooled.len(), 2, "the pool never started its two sandboxes");

    server.kill().unwrap();
    server.wait().unwrap();
    assert_eq!(
        pooled_containers(data.path()).len(),
        2,
        "the pooled sandboxes outlive the killed gateway"
    );

    // Restarted with a pool of its own: the old sandboxes go, new ones take their place.
    let server = serve_with_pool(data.path(), &listen, &http, "{bash: 1}").await;
    let mut left = pooled.clone();
    for _ in 0..600 {
        let now = pooled_containers(data.path());
        left = pooled
            .iter()
            .filter(|id| now.contains(id))
            .cloned()
            .collect();
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        left.is_empty(),
        "pooled sandboxes survived the restart: {left:?}"
    );
    let status = terminate(server).await;
    assert!(status.success(), "{status}");
    assert!(
        pooled_containers(data.path()).is_empty(),
        "a clean shutdown removes what the pool held"
    );
}

/// kill -9 of the gateway with two sessions open, then a restart: both are closed
/// (`gateway_restart`) and their containers are gone.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_with_two_sessions_open_then_restart_closes_them_and_removes_their_containers() {
    common::require_docker();
    let (data, listen) = data_dir_and_listen();
    let base = format!("http://{listen}");
    let http = reqwest::Client::new();
    let mut server = serve(data.path(), &listen, &http).await;
    let key = create_key(data.path(), &listen, "agent", "acme");
    let mut sessions = Vec::new();
    for language in ["python", "bash"] {
        let opened: serde_json::Value = http
            .post(format!("{base}/v1/sessions"))
            .bearer_auth(&key)
            .json(&json!({"language": language}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(opened["status"], "ready", "{opened}");
        sessions.push(opened["id"].as_str().unwrap().to_owned());
    }
    server.kill().unwrap();
    server.wait().unwrap();
    for id in &sessions {
        assert!(
            !common::containers_of(id).is_empty(),
            "the session's container outlives the killed gateway"
        );
    }

    let server = serve(data.path(), &listen, &http).await;
    for id in &sessions {
        let mut record = serde_json::Value::Null;
        for _ in 0..200 {
            record = get_json(&http, &format!("{base}/v1/sessions/{id}"), &key).await;
            if record["status"] == "closed" && common::containers_of(id).is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(record["closed_reason"], "gateway_restart", "{record}");
        assert!(common::removed_soon(id), "container left behind");
    }
    let status = terminate(server).await;
    assert!(status.success(), "{status}");
}
