//! A private dockerd for one test: its own data root, exec root (with its own managed
//! containerd), pid file and Unix socket under one short directory in /tmp; a bridge of its
//! own, no iptables, no TCP listener. Not `--bridge=none`: a dockerd started so deletes the
//! host's `docker0` (the machine daemon's, which other tests look for) as it starts. The runsc runtime is registered exactly as the machine's daemon
//! has it (scripts/setup.sh). Dropping it removes everything it started: containers, the
//! containerd shims and runsc processes a SIGKILL leaves behind, mounts, and the directory.

use std::fs::OpenOptions;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common::SETUP;

/// How long a (re)started daemon may take to answer on its socket.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a SIGTERMed daemon may take to stop its containers and exit at teardown.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

pub struct PrivateDockerd {
    dir: PathBuf,
    /// The daemon's own bridge (`sgd` + 4 hex digits), removed on drop.
    bridge: String,
    child: Option<Child>,
}

impl PrivateDockerd {
    /// Starts a private daemon with the machine daemon's runsc entry.
    pub fn start() -> PrivateDockerd {
        PrivateDockerd::start_configured(false)
    }

    /// The same in experimental mode: its checkpoint API (snapshots, DESIGN 15).
    #[allow(dead_code)] // the e2e binary's snapshots area; dockerd_restart.rs does not use it
    pub fn start_experimental() -> PrivateDockerd {
        PrivateDockerd::start_configured(true)
    }

    fn start_configured(experimental: bool) -> PrivateDockerd {
        let dir = tempfile::Builder::new()
            .prefix("sgd")
            .tempdir_in("/tmp")
            .expect("a directory in /tmp")
            .keep();
        let runsc = main_daemon_runsc();
        let config =
            format!("{{\"experimental\":{experimental},\"runtimes\":{{\"runsc\":{runsc}}}}}");
        std::fs::write(dir.join("daemon.json"), config).unwrap();
        let bridge = own_bridge();
        let mut daemon = PrivateDockerd {
            dir,
            bridge,
            child: None,
        };
        daemon.start_again();
        daemon
    }

    /// The daemon's Unix socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("d.sock")
    }

    /// Starts dockerd (again) on the same data root and waits until it answers.
    pub fn start_again(&mut self) {
        assert!(
            self.child.is_none(),
            "the private dockerd is already running"
        );
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("dockerd.log"))
            .unwrap();
        let path = |name: &str| self.dir.join(name).display().to_string();
        let child = Command::new("dockerd")
            .args(["--config-file", &path("daemon.json")])
            .args(["--data-root", &path("data"), "--exec-root", &path("x")])
            .args(["--pidfile", &path("pid")])
            .args(["-H", &format!("unix://{}", self.socket().display())])
            .args([
                "--bridge",
                &self.bridge,
                "--iptables=false",
                "--ip-masq=false",
            ])
            .arg("--ip-forward=false")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot run dockerd ({err}); {SETUP}"));
        self.child = Some(child);
        let started = Instant::now();
        while started.elapsed() < START_TIMEOUT {
            if self.docker(&["version"]).status.success() {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "the private dockerd exited ({status}):\n{}\n{SETUP}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "the private dockerd did not answer within {START_TIMEOUT:?}:\n{}",
            self.log_tail()
        );
    }

    /// SIGKILLs dockerd, as a crash would: its managed containerd goes with it, the shims and
    /// runsc processes of running containers stay until dockerd starts again and kills them.
    /// Returns once containerd is gone too: a restarted dockerd that still sees its pid (a
    /// zombie until init reaps it) waits for it instead of starting a new one, and gives up.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("the private dockerd runs");
        let containerd = std::fs::read_to_string(self.dir.join("x/containerd/containerd.pid"))
            .expect("the managed containerd's pid file")
            .trim()
            .to_owned();
        child.kill().unwrap();
        child.wait().unwrap();
        let stat = PathBuf::from(format!("/proc/{containerd}/stat"));
        let killed = Instant::now();
        while stat.exists() {
            assert!(
                killed.elapsed() < STOP_TIMEOUT,
                "the private dockerd's containerd (pid {containerd}) outlived it by {STOP_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `docker -H <private socket> args...`.
    pub fn docker(&self, args: &[&str]) -> Output {
        Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", self.socket().display()))
            .args(args)
            .output()
            .unwrap_or_else(|err| panic!("docker CLI not runnable ({err}); {SETUP}"))
    }

    /// Copies `image` from the machine's daemon (`docker save | docker load`).
    pub fn load_image(&self, image: &str) {
        let mut save = Command::new("docker")
            .args(["save", image])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let load = Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", self.socket().display()))
            .arg("load")
            .stdin(save.stdout.take().unwrap())
            .output()
            .unwrap();
        assert!(
            save.wait().unwrap().success(),
            "docker save {image} failed; {SETUP}"
        );
        assert!(
            load.status.success(),
            "loading {image} into the private dockerd failed: {}",
            String::from_utf8_lossy(&load.stderr)
        );
    }

    /// Names of the containers (running or not) labelled with this gateway instance.
    pub fn containers_of(&self, instance: &str) -> Vec<String> {
        let filter = format!("label=sandgate.instance={instance}");
        let out = self.docker(&["ps", "-a", "--filter", &filter, "--format", "{{.Names}}"]);
        assert!(
            out.status.success(),
            "docker ps on the private dockerd failed"
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn log_tail(&self) -> String {
        let mut log = String::new();
        if let Ok(mut file) = std::fs::File::open(self.dir.join("dockerd.log")) {
            let _ = file.read_to_string(&mut log);
        }
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Stops dockerd gracefully (it stops and unmounts its containers) after removing them.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let all = self.docker(&["ps", "-a", "-q"]);
        for id in String::from_utf8_lossy(&all.stdout).lines() {
            let _ = self.docker(&["rm", "-f", id]);
        }
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
        let _ = kill(pid, Signal::SIGTERM);
        let asked = Instant::now();
        while asked.elapsed() < STOP_TIMEOUT {
            if child.try_wait().unwrap().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for PrivateDockerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("private dockerd log (tail):\n{}", self.log_tail());
        }
        self.stop();
        // What a SIGKILLed daemon left (containerd, shims, runsc) names the directory.
        for _ in 0..50 {
            if kill_processes_naming(&self.dir) == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        unmount_under(&self.dir);
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
        if let Err(err) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("could not remove {}: {err}", self.dir.display());
        }
    }
}

/// A bridge for the private daemon with a free address of 198.18.0.0/15 (the benchmarking
/// range: nothing is ever sent there; sandboxes have no network interface anyway).
fn own_bridge() -> String {
    let n: u16 = rand::random();
    let name = format!("sgd{n:04x}");
    ip(&["link", "add", "name", &name, "type", "bridge"]);
    let address = format!("198.18.{}.1/24", n % 256);
    ip(&["addr", "add", &address, "dev", &name]);
    ip(&["link", "set", &name, "up"]);
    name
}

fn ip(args: &[&str]) {
    let status = Command::new("ip")
        .args(args)
        .status()
        .unwrap_or_else(|err| panic!("cannot run ip ({err}); {SETUP}"));
    assert!(status.success(), "ip {} failed", args.join(" "));
}

/// The machine daemon's runsc entry (`{"path":...,"runtimeArgs":[...]}`), as setup.sh wrote it.
fn main_daemon_runsc() -> String {
    let out = Command::new("docker")
        .args(["info", "--format", "{{json .Runtimes.runsc}}"])
        .output()
        .unwrap_or_else(|err| panic!("docker CLI not runnable ({err}); {SETUP}"));
    let entry = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success() && entry.contains("--network=none"),
        "the machine's dockerd has no runsc runtime with --network=none ({entry}); {SETUP}"
    );
    entry
}

/// SIGKILLs every process whose command line names `dir`; returns how many were alive.
fn kill_processes_naming(dir: &Path) -> usize {
    let needle = dir.display().to_string();
    let mut alive = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(&needle) {
            alive += 1;
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    alive
}

/// Detaches every mount below `dir`, deepest first.
fn unmount_under(dir: &Path) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|point| point.starts_with(dir))
        .collect();
    points.sort_by_key(|point| std::cmp::Reverse(point.components().count()));
    for point in points {
        if let Err(err) = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH) {
            eprintln!("could not unmount {}: {err}", point.display());
        }
    }
}
