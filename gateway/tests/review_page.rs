//! The review page (`/ui/`) in headless Chromium, driven over the DevTools protocol: a reviewer
//! pastes a key, approves a held request by clicking, and sees the execution finish in gVisor.
//! A screenshot lands in `<target>/review-page.png`. Chromium missing is a failure, not a skip.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests report failures by panicking

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use common::TestGateway;
use gateway::audit::AuditStore;

const INSTALL: &str = "install it with `apt-get install chromium` (or `make setup`)";

fn chromium_binary() -> PathBuf {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .expect("sh");
        if found.status.success() {
            return PathBuf::from(String::from_utf8_lossy(&found.stdout).trim());
        }
    }
    panic!("chromium not found: {INSTALL}");
}

/// Headless Chromium on a loopback DevTools port, killed on drop. Background networking is off:
/// the only traffic is to the gateway on 127.0.0.1.
struct Browser {
    child: Child,
    port: u16,
    profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Browser {
        let binary = chromium_binary();
        let profile = tempfile::tempdir().unwrap();
        let child = Command::new(&binary)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-default-apps",
                "--disable-sync",
                "--disable-extensions",
                "--disable-domain-reliability",
                "--metrics-recording-only",
                "--window-size=1500,1100",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {}: {err}; {INSTALL}", binary.display()));
        // Owned at once, so that every way out of here kills it (Drop).
        let mut browser = Browser {
            child,
            port: 0,
            profile,
        };
        let port_file = browser.profile.path().join("DevToolsActivePort");
        for _ in 0..300 {
            if let Ok(text) = std::fs::read_to_string(&port_file) {
                if let Some(port) = text.lines().next().and_then(|l| l.trim().parse().ok()) {
                    browser.port = port;
                    return browser;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromium did not open its DevTools port within 30 s");
    }

    /// The DevTools websocket of the first page.
    async fn page(&self) -> Cdp {
        let targets: Value = reqwest::get(format!("http://127.0.0.1:{}/json/list", self.port))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let url = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .unwrap_or_else(|| panic!("no page target: {targets}"))
            .to_owned();
        let (socket, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        Cdp { socket, next: 0 }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal DevTools protocol client: one command at a time, events ignored.
struct Cdp {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next: u64,
}

impl Cdp {
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let request = json!({"id": id, "method": method, "params": params});
        self.socket
            .send(Message::text(request.to_string()))
            .await
            .unwrap();
        let wait = async {
            while let Some(message) = self.socket.next().await {
                let Message::Text(text) = message.unwrap() else {
                    continue;
                };
                let reply: Value = serde_json::from_str(&text).unwrap();
                if reply["id"] == id {
                    assert!(reply["error"].is_null(), "{method}: {reply}");
                    return reply["result"].clone();
                }
            }
            panic!("DevTools connection closed during {method}");
        };
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .unwrap_or_else(|_| panic!("{method} got no answer"))
    }

    /// Evaluates a JavaScript expression in the page and returns its value.
    async fn eval(&mut self, expression: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            )
            .await;
        assert!(
            result["exceptionDetails"].is_null(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// Polls `expression` until it is `true`.
    async fn wait_for(&mut self, expression: &str, what: &str, seconds: u64) {
        for _ in 0..seconds * 5 {
            if self.eval(expression).await == json!(true) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let page = self.eval("document.body.innerText").await;
        panic!("timed out waiting for {what}; the page shows:\n{page}");
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::workspace_root().join("target"))
}

fn js(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

async fn key_for(gw: &TestGateway, role: &str, principal: &str) -> String {
    let pool = gw.pool().await;
    let key = AuditStore::new(pool.clone())
        .create_key_for(role, "acme", Some(principal))
        .await
        .unwrap();
    pool.close().await;
    key.secret
}

#[tokio::test]
async fn a_reviewer_approves_on_the_page_and_sees_the_run_finish() {
    let browser = Browser::start().await;
    let gw = TestGateway::start().await;
    let agent = key_for(&gw, "agent", "assistant-7").await;
    let reviewer = key_for(&gw, "reviewer", "carol").await;

    // The page is static, self-contained and under a strict CSP.
    let page = gw.http.get(format!("{}/ui/", gw.url)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'self'"), "{csp}");
    let html = page.text().await.unwrap();
    assert!(!html.contains("<script>"), "no inline script");
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no CDN"
    );

    // Code that would be markup if the page used innerHTML.
    let code = "print('<img id=injected src=x>approved on the page')";
    let (status, held) = gw
        .execute(
            &agent,
            "python",
            code,
            json!({"network": [{"host": "review.example", "port": 443}]}),
        )
        .await;
    assert_eq!(status, 202, "{held}");
    let id = held["id"].as_str().unwrap().to_owned();
    let approval = held["approval_id"].as_str().unwrap().to_owned();

    let mut cdp = browser.page().await;
    cdp.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 1500, "height": 1100, "deviceScaleFactor": 1, "mobile": false}),
    )
    .await;
    cdp.call("Page.navigate", json!({"url": format!("{}/ui/", gw.url)}))
        .await;
    cdp.wait_for(
        "document.readyState === 'complete' && !!document.getElementById('key')",
        "the page to load",
        30,
    )
    .await;

    // Paste the key once, then click Approve on the held request.
    cdp.eval(&format!(
        "document.getElementById('key').value = {}; document.getElementById('save-key').click(); true",
        js(&reviewer)
    ))
    .await;
    let row = format!("tr[data-approval-id={}]", js(&approval));
    cdp.wait_for(
        &format!(
            "!!document.querySelector({})",
            js(&format!("{row} button.approve"))
        ),
        "the pending approval",
        30,
    )
    .await;
    let shown = cdp
        .eval(&format!("document.querySelector({}).innerText", js(&row)))
        .await;
    let shown = shown.as_str().unwrap();
    assert!(
        shown.contains("<img id=injected"),
        "code shown as text: {shown}"
    );
    assert!(shown.contains("review.example"), "{shown}");
    assert_eq!(
        cdp.eval("document.getElementById('injected') === null")
            .await,
        json!(true),
        "data must never become markup"
    );
    cdp.eval(&format!(
        "document.querySelector({}).value = 'looks fine'; \
         document.querySelector({}).click(); true",
        js(&format!("{row} input.comment")),
        js(&format!("{row} button.approve"))
    ))
    .await;

    // The execution runs and the page shows it finish; a reviewer may not verify the chain.
    let status_cell = js(&format!(
        "#executions tr[data-execution-id=\"{id}\"] .status"
    ));
    cdp.wait_for(
        &format!("(document.querySelector({status_cell}) || {{}}).textContent === 'succeeded'"),
        "the execution to succeed on the page",
        120,
    )
    .await;
    cdp.wait_for(
        "document.getElementById('chain').textContent.includes('not permitted')",
        "the chain status",
        10,
    )
    .await;
    cdp.wait_for(
        &format!("!document.querySelector({})", js(&row)),
        "the approval to leave the pending list",
        10,
    )
    .await;

    // A second request waiting, so the screenshot shows the review controls too.
    let (status, waiting) = gw
        .execute(
            &agent,
            "bash",
            "curl -s https://files.example.org/data.csv | wc -l",
            json!({"network": [{"host": "files.example.org", "port": 443}]}),
        )
        .await;
    assert_eq!(status, 202, "{waiting}");
    let waiting_row = format!(
        "tr[data-approval-id={}]",
        js(waiting["approval_id"].as_str().unwrap())
    );
    cdp.wait_for(
        &format!("!!document.querySelector({})", js(&waiting_row)),
        "the second pending approval",
        30,
    )
    .await;

    let shot = cdp
        .call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        )
        .await;
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().unwrap())
        .unwrap();
    let path = target_dir().join("review-page.png");
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).unwrap();
    std::fs::write(&path, &png).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    eprintln!("screenshot: {}", path.display());

    // The API agrees with the page.
    let (_, done) = gw.get(&agent, &format!("/v1/executions/{id}")).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(
        done["stdout"],
        "<img id=injected src=x>approved on the page\n"
    );
    let (_, decided) = gw
        .get(&reviewer, &format!("/v1/approvals/{approval}"))
        .await;
    assert_eq!(decided["status"], "approved", "{decided}");
    assert_eq!(decided["reviewer"]["principal"], "carol");
    assert_eq!(decided["comment"], "looks fine");
    drop(cdp);
    drop(browser);
    gw.stop().await;
}
