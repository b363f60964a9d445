//! A static HTTPS file server in the test network namespace (198.51.100.2:443, certificate for
//! `secure.test` from a throwaway CA) serving what real tools fetch: a text file, a git
//! repository over git's "dumb" HTTP protocol, and a one-package Python index with its wheel.
//! Every request is logged (`<METHOD> <PATH> auth=<Authorization or ->`) before it is answered,
//! so a test can tell what reached it, and with which credential. Used by the image-toolbox and inspection tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::egress::netns_up;
use super::upstream::{lock_port_443, make_certificates, read_lines, UPSTREAM};

/// What `/hello.txt` holds.
pub const HELLO: &str = "hello over https\n";
/// What `README` in the served git repository holds.
pub const REPO_README: &str = "cloned through sandgate\n";
/// The package the served index offers (`sgdemo`, version 0.1: `sgdemo.VALUE == 42`).
pub const PACKAGE: &str = "sgdemo";

/// Prepares `www/` in the server's root: hello.txt, repo.git (bare, `update-server-info` done),
/// simple/sgdemo/index.html and files/sgdemo-0.1-py3-none-any.whl with a correct RECORD.
const PREPARE_PY: &str = r#"
import base64, hashlib, os, subprocess, sys, zipfile
www = os.path.join(sys.argv[1], "www")
os.makedirs(www)
open(os.path.join(www, "hello.txt"), "w").write(sys.argv[2])
work = os.path.join(sys.argv[1], "work")
git = ["git", "-c", "user.name=sandgate test", "-c", "user.email=test@sandgate.invalid",
       "-c", "init.defaultBranch=main"]
subprocess.run(git + ["init", "-q", work], check=True)
open(os.path.join(work, "README"), "w").write(sys.argv[3])
subprocess.run(git + ["-C", work, "add", "README"], check=True)
subprocess.run(git + ["-C", work, "commit", "-q", "-m", "first"], check=True)
subprocess.run(git + ["clone", "-q", "--bare", work, os.path.join(www, "repo.git")], check=True)
subprocess.run(git + ["-C", os.path.join(www, "repo.git"), "update-server-info"], check=True)
def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
files = {
    "sgdemo/__init__.py": b"VALUE = 42\n",
    "sgdemo-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: sgdemo\nVersion: 0.1\n",
    "sgdemo-0.1.dist-info/WHEEL":
        b"Wheel-Version: 1.0\nGenerator: sandgate-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = "".join("%s,%s,%d\n" % (name, digest(data), len(data)) for name, data in files.items())
record += "sgdemo-0.1.dist-info/RECORD,,\n"
os.makedirs(os.path.join(www, "files"))
wheel = os.path.join(www, "files", "sgdemo-0.1-py3-none-any.whl")
with zipfile.ZipFile(wheel, "w") as z:
    for name, data in files.items():
        z.writestr(name, data)
    z.writestr("sgdemo-0.1.dist-info/RECORD", record)
wheel_digest = hashlib.sha256(open(wheel, "rb").read()).hexdigest()
os.makedirs(os.path.join(www, "simple", "sgdemo"))
open(os.path.join(www, "simple", "sgdemo", "index.html"), "w").write(
    '<html><body><a href="/files/sgdemo-0.1-py3-none-any.whl#sha256=%s">'
    'sgdemo-0.1-py3-none-any.whl</a></body></html>\n' % wheel_digest)
"#;

/// Serves `www/` over TLS (HTTP/1.1 keep-alive) on 198.51.100.2:443, logging every request.
const SERVER_PY: &str = r#"
import functools, os, ssl, sys, threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
address, root = sys.argv[1], sys.argv[2]
lock = threading.Lock()
class Handler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def parse_request(self):
        ok = super().parse_request()
        if ok:
            with lock, open(os.path.join(root, "requests.log"), "a") as f:
                f.write("%s %s auth=%s\n" % (self.command, self.path, self.headers.get("Authorization", "-")))
        return ok
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer((address, 443), functools.partial(Handler, directory=os.path.join(root, "www")))
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(os.path.join(root, "server.pem"), os.path.join(root, "server.key"))
server.socket = context.wrap_socket(server.socket, server_side=True)
open(os.path.join(root, "ready"), "w").close()
server.serve_forever()
"#;

/// The file server, killed on drop (before the port-443 lock is released).
pub struct FilesUpstream {
    child: Child,
    root: tempfile::TempDir,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl Drop for FilesUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl FilesUpstream {
    pub async fn start() -> FilesUpstream {
        netns_up();
        let lock = lock_port_443().await;
        let root = tempfile::tempdir().unwrap();
        make_certificates(root.path());
        prepare(root.path());
        std::fs::write(root.path().join("server.py"), SERVER_PY).unwrap();
        let stderr = std::fs::File::create(root.path().join("server.stderr")).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", "sgtest", "python3"])
            .arg(root.path().join("server.py"))
            .arg(UPSTREAM)
            .arg(root.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut server = FilesUpstream {
            child,
            root,
            _lock: lock,
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self.root.path().join("ready").exists() {
            if let Some(status) = self.child.try_wait().unwrap() {
                let stderr = std::fs::read_to_string(self.root.path().join("server.stderr"));
                panic!("the file server in the test namespace exited ({status}): {stderr:?}");
            }
            assert!(
                Instant::now() < deadline,
                "the file server in the test namespace did not start within 15 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `<METHOD> <PATH> auth=<Authorization or ->` of every request that reached it, in order.
    pub fn requests(&self) -> Vec<String> {
        read_lines(&self.root.path().join("requests.log"))
    }

    /// The test CA that signed the server's certificate (PEM file).
    pub fn ca_file(&self) -> PathBuf {
        self.root.path().join("ca.pem")
    }
}

fn prepare(root: &Path) {
    std::fs::write(root.join("prepare.py"), PREPARE_PY).unwrap();
    let output = Command::new("python3")
        .arg(root.join("prepare.py"))
        .arg(root)
        .arg(HELLO)
        .arg(REPO_README)
        .output()
        .expect("python3 on the host");
    assert!(
        output.status.success(),
        "preparing the file server's content failed (needs python3 and git on the host): {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
