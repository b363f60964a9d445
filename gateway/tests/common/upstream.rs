//! Upstream servers for the egress tests, run inside the test network namespace: a TLS server
//! with a throwaway CA, and a header-echoing plain HTTP server. Each logs every accepted
//! connection before reading from it, so a test can prove that no byte reached it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::egress::netns_up;

/// The namespace side of the veth pair: where the test upstreams listen.
pub const UPSTREAM: &str = "198.51.100.2";
/// The host side of the veth pair: one of this machine's (so the gateway's) own addresses.
pub const HOST_SIDE: &str = "198.51.100.1";
/// The name the test certificate is issued for.
pub const SECURE_HOST: &str = "secure.test";

/// A small server run inside the test namespace. Every accepted TCP connection is logged to
/// `accepted.log` *before* anything is read from it (so a line proves that bytes could have
/// flowed); `tls` mode answers `hello over tls` over TLS (logging the SNI it saw to
/// `events.log`), `echo` mode answers with the request head it received. It binds first, then
/// writes the port it got to `ready`.
pub const SERVER_PY: &str = r#"
import os, socket, ssl, sys, threading
mode, address, port, root = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
lock = threading.Lock()
def log(name, line):
    with lock, open(os.path.join(root, name), "a") as f:
        f.write(line + "\n")
        f.flush()
context = None
if mode == "tls":
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(os.path.join(root, "server.pem"), os.path.join(root, "server.key"))
    context.sni_callback = lambda sock, name, ctx: log("events.log", "sni %s" % name)
server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((address, port))
server.listen(64)
with open(os.path.join(root, "ready.tmp"), "w") as f:
    f.write(str(server.getsockname()[1]))
os.rename(os.path.join(root, "ready.tmp"), os.path.join(root, "ready"))
def handle(conn, peer):
    log("accepted.log", "accept %s:%d" % peer)
    try:
        conn.settimeout(15)
        if context is not None:
            conn = context.wrap_socket(conn, server_side=True)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        head = data.split(b"\r\n\r\n", 1)[0]
        body = b"hello over tls\n" if context is not None else head + b"\r\n"
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % len(body) + body)
    except Exception as e:
        log("events.log", "error %r" % (e,))
    finally:
        conn.close()
while True:
    conn, peer = server.accept()
    threading.Thread(target=handle, args=(conn, peer), daemon=True).start()
"#;

/// A [`SERVER_PY`] process inside the test namespace, killed on drop (before its lock, if any,
/// is released).
pub struct Upstream {
    child: Child,
    pub port: u16,
    pub root: tempfile::TempDir,
    _port_lock: Option<nix::fcntl::Flock<std::fs::File>>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Upstream {
    /// Lines of `accepted.log`: one per TCP connection the upstream accepted.
    pub fn accepted(&self) -> Vec<String> {
        read_lines(&self.root.path().join("accepted.log"))
    }

    /// Lines of `events.log`: SNI names seen, handler errors.
    pub fn events(&self) -> Vec<String> {
        read_lines(&self.root.path().join("events.log"))
    }

    /// The test CA's certificate (tls mode), PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.root.path().join("ca.pem")).unwrap()
    }
}

pub fn read_lines(path: &Path) -> Vec<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => text.lines().map(str::to_owned).collect(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(err) => panic!("{}: {err}", path.display()),
    }
}

/// Port 443 inside the namespace is shared by every test (and every test process) that serves
/// TLS there: one at a time.
pub async fn lock_port_443() -> nix::fcntl::Flock<std::fs::File> {
    tokio::task::spawn_blocking(|| {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open("/run/sandgate-netns-443.lock")
            .expect("lock file for port 443 in the test namespace");
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, errno)| errno)
            .expect("flock")
    })
    .await
    .unwrap()
}

pub fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl CLI");
    assert!(
        output.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A throwaway CA (`ca.pem`) and a server certificate for [`SECURE_HOST`] signed by it
/// (`server.pem`, `server.key`) in `dir`.
pub fn make_certificates(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-subj",
        "/CN=sandgate egress test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(dir, &ca);
    let mut csr = vec!["req", "-nodes"];
    csr.extend(ec);
    let subject = format!("/CN={SECURE_HOST}");
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        &subject,
    ]);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("server.ext"),
        format!(
            "subjectAltName=DNS:{SECURE_HOST}\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        ),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ],
    );
}

/// Starts [`SERVER_PY`] in the namespace in `mode` on `port` (0: any free port).
pub fn start_upstream(
    mode: &str,
    port: u16,
    root: tempfile::TempDir,
    port_lock: Option<nix::fcntl::Flock<std::fs::File>>,
) -> Upstream {
    std::fs::write(root.path().join("server.py"), SERVER_PY).unwrap();
    let stderr = std::fs::File::create(root.path().join("server.stderr")).unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", "sgtest", "python3"])
        .arg(root.path().join("server.py"))
        .args([mode, UPSTREAM, &port.to_string()])
        .arg(root.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut upstream = Upstream {
        child,
        port,
        root,
        _port_lock: port_lock,
    };
    let ready = upstream.root.path().join("ready");
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(text) = std::fs::read_to_string(&ready) {
            upstream.port = text.trim().parse().unwrap();
            return upstream;
        }
        if let Some(status) = upstream.child.try_wait().unwrap() {
            let stderr = std::fs::read_to_string(upstream.root.path().join("server.stderr"));
            panic!("the {mode} upstream in the test namespace exited ({status}): {stderr:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the {mode} upstream in the test namespace did not start within 15 s");
}

/// The TLS upstream for [`SECURE_HOST`] on 198.51.100.2:443 (a TLS port of the proxy, so the
/// SNI check applies), with a fresh CA.
pub async fn tls_upstream() -> Upstream {
    netns_up();
    let lock = lock_port_443().await;
    let root = tempfile::tempdir().unwrap();
    make_certificates(root.path());
    start_upstream("tls", 443, root, Some(lock))
}

/// The header-echoing plain HTTP upstream on a free port.
pub fn echo_upstream() -> Upstream {
    netns_up();
    start_upstream("echo", 0, tempfile::tempdir().unwrap(), None)
}

/// A Python upstream script (given `UPSTREAM` and its directory) run in the test namespace with
/// this module's certificates, holding the port-443 lock; killed on drop. The script writes
/// `ready` when it listens and logs what it saw to `events.log`.
pub struct ScriptedUpstream {
    child: Child,
    root: tempfile::TempDir,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl Drop for ScriptedUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ScriptedUpstream {
    pub async fn start(script: &str) -> ScriptedUpstream {
        netns_up();
        let lock = lock_port_443().await;
        let root = tempfile::tempdir().unwrap();
        make_certificates(root.path());
        std::fs::write(root.path().join("server.py"), script).unwrap();
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
        let mut upstream = ScriptedUpstream {
            child,
            root,
            _lock: lock,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while !upstream.root.path().join("ready").exists() {
            if let Some(status) = upstream.child.try_wait().unwrap() {
                let stderr = std::fs::read_to_string(upstream.root.path().join("server.stderr"));
                panic!("the upstream exited ({status}): {stderr:?}");
            }
            assert!(Instant::now() < deadline, "the upstream did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        upstream
    }

    /// What the script logged, a line each.
    pub fn events(&self) -> Vec<String> {
        read_lines(&self.root.path().join("events.log"))
    }

    pub fn ca_file(&self) -> PathBuf {
        self.root.path().join("ca.pem")
    }
}
