//! The Python SDK (`clients/python`) against a live gateway: pytest runs
//! `clients/python/tests` in the Python test environment (scripts/setup.sh makes it) with this
//! gateway's URL and keys in the environment. Real dockerd, runsc and PostgreSQL behind it.

use crate::common;

use std::process::Command;

use common::{python_venv, workspace_root, TestGateway};

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_passes_its_tests_against_a_live_gateway() {
    let dataset = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dataset.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(
        dataset.path().join("people.csv"),
        "region,people\nnorth,12\n",
    )
    .unwrap();
    let census = dataset.path().to_owned();
    let gw = TestGateway::start_with(Some(common::fresh_database().await), move |config| {
        config.datasets.insert(
            "census".to_owned(),
            gateway::config::Dataset {
                path: census,
                description: "census extract".to_owned(),
            },
        );
        // tests/test_sessions.py opens one more than this.
        config.max_sessions = 2;
    })
    .await;
    let agent = gw.key("agent", "acme").await;
    let other_tenant = gw.key("agent", "classroom").await;
    let reviewer = gw.key("reviewer", "acme").await;

    let client = workspace_root().join("clients/python");
    let python = python_venv().join("bin/python");
    let url = gw.url.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
            .current_dir(&client)
            .env("PYTHONPATH", client.join("src"))
            .env("SANDGATE_URL", url)
            .env("SANDGATE_KEY", agent)
            .env("SANDGATE_REVIEWER_KEY", reviewer)
            .env("SANDGATE_OTHER_KEY", other_tenant)
            .env("SANDGATE_DATASET_FILE", "people.csv")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    gw.stop().await;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{said}");
    assert!(output.status.success(), "the SDK's tests failed:\n{said}");
}

/// `pip install ./clients/python` works: the package builds into a wheel that carries `py.typed`.
#[test]
fn the_python_package_builds_with_its_type_marker() {
    // Built from a copy: setuptools writes build/ and *.egg-info beside the sources.
    let out = tempfile::tempdir().unwrap();
    let source = tempfile::tempdir().unwrap();
    let copied = Command::new("cp")
        .arg("-r")
        .arg(workspace_root().join("clients/python/."))
        .arg(source.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let pip = python_venv().join("bin/pip");
    let built = Command::new(pip)
        .args(["wheel", "--no-deps", "--no-build-isolation", "-q", "-w"])
        .arg(out.path())
        .arg(source.path())
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "pip wheel failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let wheel = std::fs::read_dir(out.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .expect("a wheel");
    let listing = Command::new(python_venv().join("bin/python"))
        .args(["-m", "zipfile", "-l"])
        .arg(&wheel)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.contains("sandgate/py.typed"), "{listing}");
    assert!(listing.contains("sandgate/client.py"), "{listing}");
}
