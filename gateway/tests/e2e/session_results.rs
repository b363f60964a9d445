//! Rich results of python session cells, through the real stack: the last expression's
//! `text/plain` (`is_main_result`), a DataFrame's HTML, a matplotlib figure from `plt.show()`
//! as a PNG that decodes, JSON from `_repr_json_`, nothing for a statement, the stored record
//! equal to the answer, and values beyond the execution's `output_bytes` left out and flagged.

use crate::common;

use base64::Engine as _;
use serde_json::{json, Value};

use common::TestGateway;

async fn open(gw: &TestGateway, key: &str, body: Value) -> String {
    let (status, session) = gw.post(key, "/v1/sessions", &body).await;
    assert_eq!(status, 201, "{session}");
    format!(
        "/v1/sessions/{}/executions",
        session["id"].as_str().unwrap()
    )
}

async fn cell(gw: &TestGateway, key: &str, path: &str, code: &str) -> Value {
    let (status, turn) = gw.post(key, path, &json!({"code": code})).await;
    assert_eq!(status, 200, "{turn}");
    assert_eq!(turn["status"], "succeeded", "{turn}");
    turn
}

fn png_of(result: &Value) -> Vec<u8> {
    let text = result["png"].as_str().expect("a png");
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("base64")
}

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

#[tokio::test(flavor = "multi_thread")]
async fn cells_return_text_html_json_and_shown_plots_as_e2b_results() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let path = open(&gw, &key, json!({"language": "python"})).await;

    let statement = cell(&gw, &key, &path, "x = 6 * 7").await;
    assert!(statement.get("results").is_none(), "{statement}");
    assert!(statement["result"].is_null(), "{statement}");

    let value = cell(&gw, &key, &path, "x").await;
    assert_eq!(value["result"], "42");
    assert_eq!(
        value["results"],
        json!([{"is_main_result": true, "text": "42"}])
    );
    let text = cell(&gw, &key, &path, "'a string'").await;
    assert_eq!(text["results"][0]["text"], "a string", "{text}");

    let frame = cell(
        &gw,
        &key,
        &path,
        "import pandas as pd\npd.DataFrame({'city': ['Oslo', 'Lima'], 'n': [1, 2]})",
    )
    .await;
    let main = &frame["results"][0];
    assert_eq!(main["is_main_result"], true, "{frame}");
    assert!(main["text"].as_str().unwrap().contains("Oslo"), "{main}");
    let html = main["html"].as_str().expect("a DataFrame has HTML");
    assert!(html.contains("<table") && html.contains("Lima"), "{html}");

    let json_value = cell(
        &gw,
        &key,
        &path,
        "class J:\n    def _repr_json_(self):\n        return {'k': [1, 2]}\nJ()",
    )
    .await;
    assert_eq!(json_value["results"][0]["json"], json!({"k": [1, 2]}));

    // Two figures shown: two PNGs, in order; none is the main result; no savefig needed.
    let plots = cell(
        &gw,
        &key,
        &path,
        "import matplotlib.pyplot as plt\n\
         plt.plot([1, 2, 3])\nplt.show()\n\
         plt.bar(['a', 'b'], [3, 1])\nplt.show()\nprint('drawn')",
    )
    .await;
    assert_eq!(plots["stdout"], "drawn\n", "{plots}");
    let shown = plots["results"].as_array().unwrap();
    assert_eq!(shown.len(), 2, "{plots}");
    for figure in shown {
        assert_eq!(figure["is_main_result"], false);
        assert!(
            figure["text"].as_str().unwrap().starts_with("<Figure size"),
            "{figure}"
        );
        assert!(png_of(figure).starts_with(PNG_SIGNATURE));
    }
    assert_ne!(shown[0]["png"], shown[1]["png"]);

    // A figure left open is shown at the cell's end, after the cell's value.
    let open_figure = cell(&gw, &key, &path, "plt.plot([3, 1])\n7").await;
    let results = open_figure["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{open_figure}");
    assert_eq!(results[0]["text"], "7");
    assert!(png_of(&results[1]).starts_with(PNG_SIGNATURE));

    // The stored record says the same.
    let id = plots["id"].as_str().unwrap();
    let (_, stored) = gw.get(&key, &format!("/v1/executions/{id}")).await;
    assert_eq!(stored["results"], plots["results"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn results_beyond_output_bytes_are_left_out_whole_and_flagged() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let path = open(
        &gw,
        &key,
        json!({"language": "python", "limits": {"output_bytes": 4096}}),
    )
    .await;
    let big = cell(
        &gw,
        &key,
        &path,
        "import matplotlib.pyplot as plt\nplt.figure(figsize=(8, 8))\n\
         plt.plot(range(100))\nplt.show()\n'x' * 10",
    )
    .await;
    assert_eq!(big["results_truncated"], true, "{big}");
    let results = big["results"].as_array().unwrap();
    // The figure's text fits, its PNG (far over 4 KiB) does not; the value comes whole.
    assert!(results[0]["png"].is_null(), "{big}");
    assert!(results[0]["text"].as_str().unwrap().starts_with("<Figure"));
    assert_eq!(results[1]["text"], "xxxxxxxxxx");
    assert_eq!(results[1]["is_main_result"], true);
}

/// A cell that replaces what the runner might use to build results (`repr`, `base64`, `json`)
/// changes nothing of a later cell's results: the runner holds its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_cell_cannot_change_what_later_cells_report_as_results() {
    let gw = TestGateway::start().await;
    let key = gw.key("agent", "acme").await;
    let path = open(&gw, &key, json!({"language": "python"})).await;
    cell(
        &gw,
        &key,
        &path,
        "import base64, builtins, json\n\
         builtins.repr = lambda value: 'forged'\n\
         base64.b64encode = lambda *args, **kwargs: b'Zm9yZ2Vk'\n\
         json.dumps = lambda *args, **kwargs: '\"forged\"'\n\
         json.JSONEncoder.encode = lambda self, value: '\"forged\"'",
    )
    .await;
    let later = cell(
        &gw,
        &key,
        &path,
        "class J:\n    def _repr_json_(self):\n        return {'k': 1}\n    def __repr__(self):\n        return 'J()'\nJ()",
    )
    .await;
    assert_eq!(later["result"], "J()", "{later}");
    assert_eq!(
        later["results"],
        json!([{"is_main_result": true, "text": "J()", "json": {"k": 1}}])
    );
}
