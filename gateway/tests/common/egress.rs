//! Shared by the egress end-to-end tests: the test network namespace, and a policy bundle with a
//! tenant `nettest` granted exactly the test destinations.

use std::net::IpAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use serde_json::{json, Value};

use super::{copy_of_shipped, fresh_database, workspace_root, TestGateway};

/// `scripts/netns.sh up`: namespace `sgtest`, upstream side 198.51.100.2.
pub fn netns_up() {
    let status = Command::new("bash")
        .arg(workspace_root().join("scripts/netns.sh"))
        .arg("up")
        .status()
        .expect("scripts/netns.sh");
    assert!(
        status.success(),
        "scripts/netns.sh up failed: run the tests as root with iproute2"
    );
}

/// The shipped bundle plus tenant `nettest` (acme's limits) granted `allow`, nothing sent to
/// review.
pub fn bundle_with_test_tenant(allow: &[(&str, u16)]) -> tempfile::TempDir {
    let dir = copy_of_shipped();
    let tenants = dir.path().join("data/tenants.yaml");
    let mut data: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&tenants).unwrap()).unwrap();
    let mut tenant = data["tenants"]["acme"].clone();
    let allow: Vec<Value> = allow
        .iter()
        .map(|(host, port)| json!({"host": host, "ports": [port]}))
        .collect();
    tenant["network"]["allow"] = serde_yaml_ng::to_value(allow).unwrap();
    tenant["network"]["review_unlisted_hosts"] = serde_yaml_ng::Value::Bool(false);
    data["tenants"]["nettest"] = tenant;
    std::fs::write(&tenants, serde_yaml_ng::to_string(&data).unwrap()).unwrap();
    dir
}

/// A gateway on a fresh database with `policies`, and test names resolved to fixed addresses
/// by the proxy.
pub async fn gateway_with(policies: &Path, hosts: &[(&str, &str)]) -> TestGateway {
    let url = fresh_database().await;
    let dir = policies.to_owned();
    let hosts: Vec<(String, IpAddr)> = hosts
        .iter()
        .map(|(name, ip)| ((*name).to_owned(), ip.parse().unwrap()))
        .collect();
    TestGateway::start_with(Some(url), move |config| {
        config.policy_dir = dir;
        for (name, ip) in hosts {
            config.egress_hosts.insert(name, vec![ip]);
        }
    })
    .await
}

pub const UPSTREAM: &str = "198.51.100.2";

/// A static HTTP server inside the test namespace (`hello.txt`), killed on drop.
pub struct Upstream {
    child: Child,
    pub port: u16,
    _root: tempfile::TempDir,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn upstream() -> Upstream {
    netns_up();
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("hello.txt"), "hello through the proxy\n").unwrap();
    // One port per test process and call: tests of one binary run side by side.
    static CALLS: AtomicU16 = AtomicU16::new(0);
    let port =
        20_000 + (std::process::id() % 15_000) as u16 + CALLS.fetch_add(1, Ordering::SeqCst) * 7;
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            "sgtest",
            "python3",
            "-m",
            "http.server",
            "--bind",
            UPSTREAM,
        ])
        .arg(port.to_string())
        .current_dir(root.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..100 {
        let ready = Command::new("ip")
            .args(["netns", "exec", "sgtest", "python3", "-c"])
            .arg(format!(
                "import socket; socket.create_connection(('{UPSTREAM}', {port}), timeout=1)"
            ))
            .stderr(Stdio::null())
            .status()
            .unwrap();
        if ready.success() {
            return Upstream {
                child,
                port,
                _root: root,
            };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the upstream in the test namespace did not start");
}
