use super::*;

/// A record as the gateway answers `POST /v1/executions` (`print(1)` that succeeded, with
/// every field the record always has), field for field.
const FINISHED: &str = concat!(
    r#"{"id":"ex_1","status":"succeeded","tenant":"acme","language":"python","exit_code":0,"#,
    r#""stdout":"1\n","stderr":"","stdout_truncated":false,"stderr_truncated":false,"#,
    r#""duration_ms":412,"decision":{"id":"dc_1","allow":true,"backend":"gvisor","reasons":[],"#,
    r#""policy_revision":"sha256:ab"},"limits":{"timeout_ms":5000,"memory_mb":256,"cpus":1.0,"#,
    r#""pids":128,"disk_mb":256,"output_bytes":1048576},"labels":{"agent":"analyst-7"},"#,
    r#""outputs":[{"path":"plot.png","bytes":20311,"sha256":"cd"}],"outputs_skipped":[],"#,
    r#""outputs_truncated":false,"created_at":"2026-12-01T10:00:00Z","#,
    r#""started_at":"2026-12-01T10:00:00.100Z","finished_at":"2026-12-01T10:00:00.512Z","#,
    r#""start":"warm","container":"sandgate-ex_1"}"#
);

#[test]
fn a_finished_record_round_trips_exactly() {
    let view: ExecutionView = serde_json::from_str(FINISHED).unwrap();
    assert_eq!(view.status, ExecutionStatus::Succeeded);
    assert_eq!(view.exit_code, Some(0));
    assert_eq!(view.outputs[0].path, "plot.png");
    assert_eq!(view.decision.backend.as_deref(), Some("gvisor"));
    assert_eq!(view.approval_id, None);
    assert_eq!(serde_json::to_string(&view).unwrap(), FINISHED);
}

#[test]
fn nulls_stay_null_and_absent_fields_stay_absent() {
    let mut view: ExecutionView = serde_json::from_str(FINISHED).unwrap();
    view.status = ExecutionStatus::PendingApproval;
    view.exit_code = None;
    view.started_at = None;
    view.start = None;
    view.approval_id = Some("ap_1".to_owned());
    let value = serde_json::to_value(&view).unwrap();
    assert_eq!(value["status"], "pending_approval");
    assert!(value["exit_code"].is_null() && value.get("exit_code").is_some());
    assert!(value.get("start").is_none() && value.get("stdout_base64").is_none());
    assert_eq!(value["approval_id"], "ap_1");
}

#[test]
fn a_listing_leaves_out_the_output_and_reads_back() {
    let view: ExecutionView = serde_json::from_str(FINISHED).unwrap();
    let page = ExecutionPage {
        executions: vec![view.clone()],
        next_before: None,
    };
    let value = serde_json::to_value(&page).unwrap();
    assert!(value["executions"][0].get("stdout").is_none());
    assert!(value["executions"][0].get("stderr").is_none());
    assert!(value.get("next_before").is_none());
    let back: ExecutionPage = serde_json::from_value(value).unwrap();
    assert_eq!(back.executions[0].stdout, "");
    assert_eq!(back.executions[0].id, view.id);
}

#[test]
fn a_request_serialises_as_design_shows_and_refuses_unknown_fields() {
    let mut request = ExecutionRequest::new("python", "print(1)");
    request.network.push(HostPort {
        host: "pypi.org".to_owned(),
        port: 443,
    });
    request.limits.timeout_ms = Some(5000);
    assert_eq!(
        serde_json::to_string(&request).unwrap(),
        r#"{"language":"python","code":"print(1)","network":[{"host":"pypi.org","port":443}],"limits":{"timeout_ms":5000},"wait":true}"#
    );
    let read: ExecutionRequest =
        serde_json::from_str(r#"{"language":"bash","code":"true"}"#).unwrap();
    assert_eq!(read, ExecutionRequest::new("bash", "true"));
    let typo = r#"{"language":"bash","code":"true","limit":{}}"#;
    assert!(serde_json::from_str::<ExecutionRequest>(typo).is_err());
    let bad_limit = r#"{"language":"bash","code":"true","limits":{"timeout":1}}"#;
    assert!(serde_json::from_str::<ExecutionRequest>(bad_limit).is_err());
}
