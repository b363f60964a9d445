//! The deployment sketch in `deploy/kubernetes/` keeps what matters (docs/kubernetes.md): sandbox
//! pods run under gVisor with no service-account token, every NetworkPolicy that selects them lets
//! them reach only the gateway's proxy port, agent-sandbox's own policy is off, and the gateway's
//! database URL comes from a Secret.
//!
//! Its own binary, without the e2e harness: it needs no service, so `make check` runs it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};

const SANDBOX_NAMESPACE: &str = "sandgate-sandboxes";
const GATEWAY_NAMESPACE: &str = "sandgate";
const PROXY_PORT: u64 = 3128;

/// Every document of every `*.yaml` in deploy/kubernetes, as JSON, with its file name.
fn manifests() -> Vec<(String, Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let mut found = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = Value::deserialize(document)
                .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            if !value.is_null() {
                found.push((path.display().to_string(), value));
            }
        }
    }
    assert!(found.len() >= 10, "too few manifests: {}", found.len());
    found
}

fn of_kind<'a>(all: &'a [(String, Value)], kind: &str) -> Vec<&'a Value> {
    all.iter()
        .map(|(_, v)| v)
        .filter(|v| v["kind"] == kind)
        .collect()
}

fn labels(template: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(template["metadata"]["labels"].clone()).unwrap_or_default()
}

/// Whether a selector (matchLabels only: anything else fails the test) selects `labels`.
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let fields: Vec<&String> = selector
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    assert!(
        fields.iter().all(|field| *field == "matchLabels"),
        "only matchLabels selectors are checked here: {selector}"
    );
    let wanted: BTreeMap<String, String> =
        serde_json::from_value(selector["matchLabels"].clone()).unwrap_or_default();
    wanted
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
}

/// (where, pod template) of every sandbox pod: PodTemplates and agent-sandbox SandboxTemplates.
fn sandbox_pods(all: &[(String, Value)]) -> Vec<(String, Value)> {
    let mut pods = Vec::new();
    for template in of_kind(all, "PodTemplate") {
        pods.push((
            format!("PodTemplate {}", template["metadata"]["name"]),
            template["template"].clone(),
        ));
    }
    for template in of_kind(all, "SandboxTemplate") {
        pods.push((
            format!("SandboxTemplate {}", template["metadata"]["name"]),
            template["spec"]["podTemplate"].clone(),
        ));
    }
    assert!(pods.len() >= 2, "no sandbox pod templates");
    pods
}

fn gateway_pod(all: &[(String, Value)]) -> Value {
    let deployments = of_kind(all, "Deployment");
    let gateway = deployments
        .iter()
        .find(|d| d["metadata"]["name"] == "sandgate-gateway")
        .expect("a sandgate-gateway Deployment");
    assert_eq!(gateway["metadata"]["namespace"], GATEWAY_NAMESPACE);
    assert!(
        gateway["spec"]["replicas"].as_u64().unwrap() >= 2,
        "replicas: {gateway}"
    );
    gateway["spec"]["template"].clone()
}

#[test]
fn sandbox_pods_run_in_gvisor_without_a_token_or_a_resolver() {
    let all = manifests();
    let runtime = of_kind(&all, "RuntimeClass");
    assert!(
        runtime
            .iter()
            .any(|r| r["metadata"]["name"] == "gvisor" && r["handler"] == "runsc"),
        "no RuntimeClass gvisor with handler runsc"
    );
    let pods = sandbox_pods(&all);
    for (name, pod) in &pods {
        let spec = &pod["spec"];
        assert_eq!(spec["runtimeClassName"], "gvisor", "{name}");
        assert_eq!(spec["automountServiceAccountToken"], false, "{name}");
        assert_eq!(spec["enableServiceLinks"], false, "{name}");
        assert_ne!(spec["hostNetwork"], true, "{name}");
        assert_eq!(spec["dnsPolicy"], "None", "{name}");
        assert_eq!(
            labels(pod).get("sandgate.dev/role").map(String::as_str),
            Some("sandbox"),
            "{name}"
        );
        for container in spec["containers"].as_array().unwrap() {
            let security = &container["securityContext"];
            assert_eq!(security["allowPrivilegeEscalation"], false, "{name}");
            assert_eq!(security["capabilities"]["drop"], json!(["ALL"]), "{name}");
            assert!(
                container["resources"]["limits"]["memory"].is_string(),
                "{name}"
            );
        }
    }
    // The cold-start pod and the warm pool's pod are the same pod.
    assert_eq!(
        pods[0].1["spec"], pods[1].1["spec"],
        "the sandbox pod specs differ"
    );
    for template in of_kind(&all, "SandboxTemplate") {
        assert_eq!(
            template["spec"]["networkPolicyManagement"], "Unmanaged",
            "agent-sandbox's managed policy allows the internet: {template}"
        );
        assert_eq!(template["metadata"]["namespace"], SANDBOX_NAMESPACE);
    }
    let templates: Vec<&Value> = of_kind(&all, "SandboxTemplate")
        .into_iter()
        .map(|t| &t["metadata"]["name"])
        .collect();
    for pool in of_kind(&all, "SandboxWarmPool") {
        let name = &pool["spec"]["sandboxTemplateRef"]["name"];
        assert!(templates.contains(&name), "{pool} names no template here");
    }
}

#[test]
fn sandbox_egress_reaches_only_the_proxy() {
    let all = manifests();
    let gateway = gateway_pod(&all);
    let gateway_labels = labels(&gateway);
    let proxy_ports: Vec<u64> = gateway["spec"]["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].as_u64().unwrap())
        .collect();
    assert!(
        proxy_ports.contains(&PROXY_PORT),
        "the gateway exposes no proxy port"
    );
    let namespace_labels = BTreeMap::from([(
        "kubernetes.io/metadata.name".to_owned(),
        GATEWAY_NAMESPACE.to_owned(),
    )]);
    for (name, pod) in sandbox_pods(&all) {
        let pod_labels = labels(&pod);
        let policies: Vec<&Value> = of_kind(&all, "NetworkPolicy")
            .into_iter()
            .filter(|p| p["metadata"]["namespace"] == SANDBOX_NAMESPACE)
            .filter(|p| {
                p["spec"]["podSelector"] == json!({})
                    || selects(&p["spec"]["podSelector"], &pod_labels)
            })
            .collect();
        let restricted = policies.iter().any(|p| {
            p["spec"]["policyTypes"]
                .as_array()
                .unwrap()
                .contains(&json!("Egress"))
        });
        assert!(restricted, "{name}: no NetworkPolicy restricts its egress");
        for policy in &policies {
            let empty = vec![];
            for rule in policy["spec"]["egress"].as_array().unwrap_or(&empty) {
                let peers = rule["to"]
                    .as_array()
                    .expect("an egress rule without `to` allows everywhere");
                for peer in peers {
                    assert!(
                        peer.get("ipBlock").is_none(),
                        "{name}: ipBlock egress: {rule}"
                    );
                    assert!(
                        selects(&peer["namespaceSelector"], &namespace_labels),
                        "{name}: egress to another namespace: {rule}"
                    );
                    assert!(
                        selects(&peer["podSelector"], &gateway_labels)
                            && peer["podSelector"] != json!({}),
                        "{name}: egress to pods other than the gateway: {rule}"
                    );
                }
                let ports = rule["ports"]
                    .as_array()
                    .expect("an egress rule without ports allows every port");
                for port in ports {
                    assert_eq!(port["port"], PROXY_PORT, "{name}: {rule}");
                    assert_eq!(port["protocol"], "TCP", "{name}: {rule}");
                }
            }
            if let Some(ingress) = policy["spec"]["ingress"].as_array() {
                assert!(
                    ingress.is_empty(),
                    "{name}: ingress to sandbox pods: {policy}"
                );
            }
        }
    }
}

#[test]
fn the_database_url_comes_from_a_secret() {
    let all = manifests();
    let gateway = gateway_pod(&all);
    for container in gateway["spec"]["containers"].as_array().unwrap() {
        let env = container["env"].as_array().unwrap();
        let url = env
            .iter()
            .find(|e| e["name"] == "SANDGATE_DATABASE_URL")
            .expect("the gateway has no SANDGATE_DATABASE_URL");
        assert!(url.get("value").is_none(), "a literal database URL: {url}");
        let secret = &url["valueFrom"]["secretKeyRef"];
        assert!(
            secret["name"].is_string() && secret["key"].is_string(),
            "{url}"
        );
        for variable in env {
            let value = variable["value"].as_str().unwrap_or("");
            assert!(
                !value.contains("postgres://"),
                "a database URL in plain env: {variable}"
            );
        }
    }
    for (file, manifest) in &all {
        assert_ne!(
            manifest["kind"], "Secret",
            "{file}: secrets are created, never committed"
        );
    }
}
