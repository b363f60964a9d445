//! A session sandbox's later processes (E2B's `process.Process`), beside its runner: each one
//! its own attach supervisor (`sandbox_protocol`'s `procs` module), started as the program's
//! user, with its own stdin, stdout and stderr. What the gateway needs of them, nothing about
//! Docker.

use std::pin::Pin;

use futures_util::stream::BoxStream;
use tokio::io::AsyncWrite;

pub use sandbox_protocol::{ProcessSignal, PtySize};

use super::Channel;

/// What to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    /// Names the process for signals ([`sandbox_protocol::valid_tag`]): its execution's id.
    pub tag: String,
    pub argv: Vec<String>,
    /// `NAME=value`, added to the sandbox's environment.
    pub env: Vec<String>,
    pub cwd: String,
    /// Whether the process reads what the gateway writes (else its stdin is empty).
    pub stdin: bool,
    /// A terminal of this size (PTY mode): the process's stdin, stdout and stderr are the
    /// terminal, its output comes as stdout, and its input is `sandbox_protocol::PtyFrame`s.
    pub pty: Option<PtySize>,
}

/// A directory watcher to start (`sandbox_protocol`'s `watch` module).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    /// Names the watcher ([`sandbox_protocol::valid_tag`]).
    pub tag: String,
    /// Absolute and normalised, in a writable place.
    pub path: String,
    pub recursive: bool,
}

/// A started process: its output until its streams close, its stdin when asked for.
pub struct StartedProcess {
    /// The runtime's handle, for [`super::SandboxRuntime::process_exit`].
    pub handle: String,
    pub output: BoxStream<'static, Result<(Channel, Vec<u8>), String>>,
    pub input: Option<Pin<Box<dyn AsyncWrite + Send>>>,
}

impl std::fmt::Debug for StartedProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartedProcess")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}
