//! Headless Chromium driven over the DevTools protocol, for the page tests (`review_page.rs`,
//! `audit_page.rs`). Chromium missing is a failure, not a skip. Its background networking is
//! off: the only traffic is to the gateway on 127.0.0.1.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // shared by test binaries; panics are failure reports

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

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
pub struct Browser {
    child: Child,
    port: u16,
    profile: tempfile::TempDir,
}

impl Browser {
    pub async fn start() -> Browser {
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

    /// Downloads land in `dir` without asking, while the returned browser-wide DevTools
    /// session is held.
    pub async fn allow_downloads(&self, dir: &Path) -> Cdp {
        let version: Value = reqwest::get(format!("http://127.0.0.1:{}/json/version", self.port))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let url = version["webSocketDebuggerUrl"].as_str().unwrap().to_owned();
        let (socket, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let mut browser = Cdp { socket, next: 0 };
        browser
            .call(
                "Browser.setDownloadBehavior",
                json!({"behavior": "allow", "downloadPath": dir.to_str().unwrap()}),
            )
            .await;
        browser
    }

    /// The DevTools websocket of the first page.
    pub async fn page(&self) -> Cdp {
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
pub struct Cdp {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next: u64,
}

impl Cdp {
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
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
    pub async fn eval(&mut self, expression: &str) -> Value {
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
    pub async fn wait_for(&mut self, expression: &str, what: &str, seconds: u64) {
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

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

pub fn js(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned()
}

impl Cdp {
    /// Opens `url` at 1500x1100 and waits until the document has loaded.
    pub async fn open(&mut self, url: &str) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1500, "height": 1100, "deviceScaleFactor": 1, "mobile": false}),
        )
        .await;
        self.call("Page.navigate", json!({"url": url})).await;
        self.wait_for(
            "document.readyState === 'complete' && !!document.getElementById('key')",
            "the page to load",
            30,
        )
        .await;
    }

    /// From the next navigation on, every Content-Security-Policy violation of the page is
    /// kept in `window.__csp` (read it with [`Cdp::csp_violations`]).
    pub async fn record_csp_violations(&mut self) {
        self.call("Page.enable", json!({})).await;
        self.call(
            "Page.addScriptToEvaluateOnNewDocument",
            json!({"source": "window.__csp = []; document.addEventListener(\
                'securitypolicyviolation', (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"}),
        )
        .await;
    }

    pub async fn csp_violations(&mut self) -> Value {
        self.eval("window.__csp || ['not recorded']").await
    }

    /// Types `key` into the key field and submits it.
    pub async fn use_key(&mut self, key: &str) {
        self.eval(&format!(
            "document.getElementById('key').value = {}; \
             document.getElementById('save-key').click(); true",
            js(key)
        ))
        .await;
    }

    /// Clicks the first element matching `selector`; it must exist.
    pub async fn click(&mut self, selector: &str) {
        let clicked = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({}); if (!e) return false; \
                 e.click(); return true; }})()",
                js(selector)
            ))
            .await;
        assert_eq!(clicked, json!(true), "nothing matches {selector}");
    }

    /// The `innerText` of the first element matching `selector` ("" when none does).
    pub async fn text(&mut self, selector: &str) -> String {
        self.eval(&format!(
            "(document.querySelector({}) || {{innerText: ''}}).innerText",
            js(selector)
        ))
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
    }

    /// A full-page PNG at `<target>/<name>`; returns its path.
    pub async fn screenshot(&mut self, name: &str) -> PathBuf {
        let shot = self
            .call(
                "Page.captureScreenshot",
                json!({"format": "png", "captureBeyondViewport": true}),
            )
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
        let path = target_dir().join(name);
        std::fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).unwrap();
        std::fs::write(&path, &png).unwrap();
        eprintln!("screenshot: {}", path.display());
        path
    }
}
