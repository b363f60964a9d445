//! The container runtime seam: what the gateway needs from a sandbox, and nothing about Docker.
//! `docker.rs` is the only file that imports bollard.

pub mod cleanup;
pub mod docker;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use policy_engine::Limits;

/// Label carried by every sandbox container; its value is the execution id.
pub const EXECUTION_LABEL: &str = "sandgate.execution";
/// Label naming the gateway instance that created the container.
pub const INSTANCE_LABEL: &str = "sandgate.instance";
/// Where the `sandbox-init` binary is mounted, read-only, inside every sandbox.
pub const INIT_PATH: &str = "/sandgate/init";

/// What `sandbox-init` reads from its stdin: one JSON line.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobSpec {
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    pub files: Vec<JobFile>,
    /// The in-sandbox bridge to the egress socket; absent without a network grant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<JobProxy>,
    /// Set by the runtime per run: the secret that authenticates sandbox-init's exit trailer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_nonce: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobProxy {
    pub listen: String,
    pub socket: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobFile {
    pub path: String,
    pub content_b64: String,
    pub mode: u32,
}

/// A host directory mounted read-only into the sandbox (a dataset).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReadOnlyMount {
    pub source: PathBuf,
    pub target: String,
}

/// Everything needed to run one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub execution_id: String,
    pub instance: String,
    pub image: String,
    /// Docker runtime name (`runsc`).
    pub runtime: String,
    pub init_binary: PathBuf,
    pub limits: Limits,
    pub mounts: Vec<ReadOnlyMount>,
    /// The execution's egress socket directory, mounted at `/run/sandgate`: the one host path
    /// a sandbox may reach that is not read-only data.
    pub egress_dir: Option<PathBuf>,
    /// The execution's output area on the host, mounted at `/output`; `None`: a tmpfs inside
    /// the sandbox whose contents are discarded.
    pub output_dir: Option<PathBuf>,
    pub job: JobSpec,
    /// Receives every byte of output that is kept, as it arrives (for streaming).
    pub sink: Option<Arc<dyn OutputSink>>,
    /// Fires when the execution is cancelled: the sandbox is killed at once.
    pub cancel: CancellationToken,
}

impl SandboxSpec {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.limits.timeout_ms)
    }
}

/// Which stream output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Stdout,
    Stderr,
}

/// Where kept output goes while the program runs.
pub trait OutputSink: Send + Sync + std::fmt::Debug {
    fn push(&self, channel: Channel, bytes: &[u8]);
}

/// Output captured up to a byte cap; the rest is read and dropped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CappedOutput {
    pub bytes: Vec<u8>,
    pub truncated: bool,
}

impl CappedOutput {
    /// Keeps what fits under `cap` and returns it.
    pub fn push<'a>(&mut self, chunk: &'a [u8], cap: usize) -> &'a [u8] {
        let room = cap.saturating_sub(self.bytes.len());
        if chunk.len() > room {
            self.truncated = true;
        }
        let kept = &chunk[..chunk.len().min(room)];
        self.bytes.extend_from_slice(kept);
        kept
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// The longest code a trailer carries (0..=255).
const TRAILER_DIGITS: usize = 3;

/// Takes sandbox-init's exit trailer, `\0sandgate-exit:<nonce>:<code>\n` (see its crate docs),
/// out of the stderr stream. Only a trailer with this run's nonce counts: the program never
/// learns the nonce, so it cannot forge one. Bytes that might begin the trailer (from a NUL on)
/// are held back until they cannot, so it never reaches the record or the event stream, and
/// ordinary stderr (which holds no NUL) is passed on at once.
#[derive(Debug)]
pub struct ExitTrailer {
    prefix: Vec<u8>,
    held: Vec<u8>,
    code: Option<u8>,
}

impl ExitTrailer {
    pub fn new(nonce: &str) -> ExitTrailer {
        ExitTrailer {
            prefix: format!("\0sandgate-exit:{nonce}:").into_bytes(),
            held: Vec::new(),
            code: None,
        }
    }

    /// Feeds a stderr chunk; returns what may be passed on.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.code.is_some() {
            // After the trailer the init is gone: nothing that follows is the program's.
            return Vec::new();
        }
        self.held.extend_from_slice(chunk);
        let mut last_nul = None;
        let mut from = 0;
        while let Some(offset) = self.held[from..].iter().position(|byte| *byte == 0) {
            let start = from + offset;
            if let Some(code) = complete_trailer(&self.prefix, &self.held[start..]) {
                self.code = Some(code);
                let released = self.held[..start].to_vec();
                self.held.clear();
                return released;
            }
            last_nul = Some(start);
            from = start + 1;
        }
        match last_nul {
            Some(start) if could_begin_trailer(&self.prefix, &self.held[start..]) => {
                let tail = self.held.split_off(start);
                std::mem::replace(&mut self.held, tail)
            }
            _ => std::mem::take(&mut self.held),
        }
    }

    /// The end of the stream: what was held back, and the code if the trailer came.
    pub fn finish(&mut self) -> (Vec<u8>, Option<u8>) {
        (std::mem::take(&mut self.held), self.code)
    }
}

fn complete_trailer(prefix: &[u8], bytes: &[u8]) -> Option<u8> {
    let rest = bytes.strip_prefix(prefix)?;
    let end = rest.iter().position(|byte| *byte == b'\n')?;
    let digits = &rest[..end];
    if digits.is_empty() || digits.len() > TRAILER_DIGITS {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

fn could_begin_trailer(prefix: &[u8], bytes: &[u8]) -> bool {
    if bytes.len() <= prefix.len() {
        return prefix.starts_with(bytes);
    }
    bytes.strip_prefix(prefix).is_some_and(|digits| {
        digits.len() <= TRAILER_DIGITS && digits.iter().all(u8::is_ascii_digit)
    })
}

/// How a sandbox ended.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub exit_code: Option<i64>,
    pub timed_out: bool,
    /// Stopped on request (`POST /v1/executions/{id}/cancel`).
    pub cancelled: bool,
    pub oom_killed: bool,
    /// The exit code `sandbox-init` reported itself. `None` with neither timeout nor cancel:
    /// the sandbox died under the program (gVisor's kernel gave up, or the container was killed).
    pub init_exit: Option<i64>,
    /// The container is confirmed gone: nothing in the sandbox runs any more, so what it left
    /// (the output area) can no longer change under the gateway.
    pub removed: bool,
    pub stdout: CappedOutput,
    pub stderr: CappedOutput,
    pub started_at: DateTime<Utc>,
    pub duration: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("container runtime unavailable: {0}")]
    Unavailable(String),
    #[error("{operation} timed out after {seconds} s")]
    Timeout {
        operation: &'static str,
        seconds: u64,
    },
    #[error("{operation} failed: {message}")]
    Docker {
        operation: &'static str,
        message: String,
    },
    #[error("sandbox-init binary {path} is missing; build it with `make build`")]
    MissingInit { path: PathBuf },
}

/// Readiness of the runtime, for `/readyz`.
#[derive(Debug, Clone, Serialize)]
pub struct RuntimeHealth {
    pub docker: Result<String, String>,
    pub runtimes: BTreeMap<String, bool>,
}

/// A sandbox container as listed by the runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxInfo {
    pub container_id: String,
    pub execution_id: String,
    pub instance: Option<String>,
}

/// The one seam where a fake is allowed (fast tests of orchestration); security properties are
/// only ever shown through the Docker implementation.
pub trait SandboxRuntime: Send + Sync + 'static {
    /// Creates, starts, waits for and always removes one sandbox.
    fn run(&self, spec: SandboxSpec) -> BoxFuture<'_, Result<RunOutcome, RuntimeError>>;
    /// Checks the daemon and which of `runtimes` it has registered.
    fn health<'a>(&'a self, runtimes: &'a [String]) -> BoxFuture<'a, RuntimeHealth>;
    /// Every sandbox container, whoever created it.
    fn list(&self) -> BoxFuture<'_, Result<Vec<SandboxInfo>, RuntimeError>>;
    /// Kills and removes one container, however wedged.
    fn destroy<'a>(&'a self, container_id: &'a str) -> BoxFuture<'a, Result<(), RuntimeError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: &str = "n0nce";

    fn through(chunks: &[&[u8]]) -> (Vec<u8>, Option<u8>) {
        let mut trailer = ExitTrailer::new(NONCE);
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend(trailer.feed(chunk));
        }
        let (rest, code) = trailer.finish();
        out.extend(rest);
        (out, code)
    }

    #[test]
    fn exit_trailer_is_taken_out_wherever_the_chunks_split() {
        let stream = b"warn\n\0sandgate-exit:n0nce:137\n";
        for split in 0..stream.len() {
            let (before, after) = stream.split_at(split);
            assert_eq!(
                through(&[before, after]),
                (b"warn\n".to_vec(), Some(137)),
                "{split}"
            );
        }
        // Byte by byte, too.
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(through(&bytes), (b"warn\n".to_vec(), Some(137)));
    }

    #[test]
    fn stderr_without_a_trailer_passes_through_and_says_so() {
        assert_eq!(through(&[b"a\0b\n", b"c"]), (b"a\0b\nc".to_vec(), None));
        assert_eq!(
            through(&[b"x\0sandgate-ex"]),
            (b"x\0sandgate-ex".to_vec(), None)
        );
        assert_eq!(
            through(&[b"\0sandgate-exit:n0nce:1234\n"]),
            (b"\0sandgate-exit:n0nce:1234\n".to_vec(), None)
        );
        // A trailer with another nonce (a forgery by the program) is ordinary stderr.
        let forged: &[u8] = b"\0sandgate-exit:guess:0\n\0sandgate-exit:0\n";
        assert_eq!(through(&[forged]), (forged.to_vec(), None));
        // Ordinary text is released at once, not held back.
        let mut trailer = ExitTrailer::new(NONCE);
        assert_eq!(trailer.feed(b"line\n"), b"line\n");
        // A NUL in the program's own output before the real trailer is kept.
        assert_eq!(
            through(&[b"\0\0data", b"\0sandgate-exit:n0nce:0\n"]),
            (b"\0\0data".to_vec(), Some(0))
        );
    }

    #[test]
    fn capped_output_keeps_prefix_and_flags_truncation() {
        let mut out = CappedOutput::default();
        out.push(b"hello ", 8);
        assert!(!out.truncated);
        out.push(b"world", 8);
        assert_eq!(out.bytes, b"hello wo");
        assert!(out.truncated);
        out.push(b"more", 8);
        assert_eq!(out.bytes, b"hello wo");
    }
}
