//! A pooled sandbox's init (`pool [python [MODULE...]]`): started before any execution exists,
//! it prints [`READY_LINE`] and waits for its job on stdin, the same job line a cold sandbox
//! gets (see `sandbox_protocol`). With `python`, a resident interpreter
//! ([`sandbox_protocol::PYTHON_RUNNER`]) imports the modules first and prints the ready line
//! itself; once the job arrives and its files are written, the init hands it the program
//! ([`Handover::hand_over`]) and supervises it as it would the program. If that interpreter
//! dies while waiting, the init exits at once: the gateway sees the sandbox end and never hands
//! it a job.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;

use nix::sys::signal::kill;
use nix::unistd::Pid;
use sandbox_protocol::{RunnerJob, PYTHON_RUNNER, PYTHON_RUNNER_NAME, READY_LINE};
use thiserror::Error;

use crate::process::{Outcome, SuperviseError, Supervisor, WAKE_SIGNAL};
use crate::spec::{self, Job, SpecError};
use crate::streams::{self, Host, Relaying, StreamError};
use crate::InitError;

/// Longest accepted preload module name.
const MAX_MODULE_NAME: usize = 128;
/// Most preload modules.
const MAX_MODULES: usize = 64;

/// What waits in the pooled sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runner {
    /// Only the init: the program is spawned once the job arrives.
    Plain,
    /// A Python interpreter with these modules imported runs the program itself.
    Python { preload: Vec<String> },
}

#[derive(Debug, Error)]
pub enum PoolError {
    #[error("preload module names must be dotted Python identifiers: {0:?}")]
    Module(OsString),
    #[error("at most {MAX_MODULES} preload modules")]
    TooManyModules,
    #[error("starting the resident runner: {0}")]
    Start(SuperviseError),
    #[error("printing the ready line: {0}")]
    Ready(std::io::Error),
    #[error("the resident runner ended while waiting for a job (exit {})", .0.exit_code())]
    RunnerDied(Outcome),
    #[error("waiting for the job: {0}")]
    Wait(SuperviseError),
    #[error(transparent)]
    Job(SpecError),
    #[error("handing the job to the resident runner: {0}")]
    Handover(std::io::Error),
    #[error(transparent)]
    Streams(StreamError),
}

impl Runner {
    /// Parses the arguments after `pool`.
    pub fn parse(mut args: impl Iterator<Item = OsString>) -> Result<Runner, InitError> {
        match args.next() {
            None => Ok(Runner::Plain),
            Some(name) if name == PYTHON_RUNNER_NAME => {
                let preload = args
                    .map(|module| match module.to_str() {
                        Some(text) if is_module_name(text) => Ok(text.to_owned()),
                        _ => Err(InitError::Pool(PoolError::Module(module))),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if preload.len() > MAX_MODULES {
                    return Err(InitError::Pool(PoolError::TooManyModules));
                }
                Ok(Runner::Python { preload })
            }
            Some(_) => Err(InitError::Args),
        }
    }
}

fn is_module_name(text: &str) -> bool {
    text.len() <= MAX_MODULE_NAME
        && text.split('.').all(|part| {
            part.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// A pooled sandbox waiting for its job.
#[derive(Debug)]
pub struct Waiting {
    runner: Option<Handover>,
}

/// The resident interpreter, waiting for the program.
#[derive(Debug)]
pub struct Handover {
    child: Child,
    stdin: ChildStdin,
    relaying: Relaying,
}

impl Waiting {
    /// Starts what waits: for [`Runner::Plain`] the ready line is printed here.
    pub fn start(supervisor: &Supervisor, runner: Runner) -> Result<Waiting, PoolError> {
        match runner {
            Runner::Plain => {
                streams::write_all(Host::Stdout, format!("{READY_LINE}\n").as_bytes())
                    .map_err(PoolError::Ready)?;
                Ok(Waiting { runner: None })
            }
            Runner::Python { preload } => {
                let argv: Vec<String> = ["python3", "-c", PYTHON_RUNNER, READY_LINE]
                    .into_iter()
                    .map(str::to_owned)
                    .chain(preload)
                    .collect();
                let (captured, ends) = streams::capture().map_err(PoolError::Streams)?;
                let mut child = supervisor
                    .spawn(&argv, None, Stdio::piped(), ends)
                    .map_err(PoolError::Start)?;
                // Right after the spawn: the ready line comes through the pipes.
                let relaying = captured.relay(None).map_err(PoolError::Streams)?;
                let stdin = child.stdin.take().ok_or_else(|| {
                    PoolError::Start(SuperviseError::Spawn(std::io::Error::other(
                        "no stdin pipe to the runner",
                    )))
                })?;
                Ok(Waiting {
                    runner: Some(Handover {
                        child,
                        stdin,
                        relaying,
                    }),
                })
            }
        }
    }

    /// Waits for the job line. With a resident runner, the line is read on a thread while the
    /// init keeps reaping: a runner that dies first ends the wait (and so the sandbox).
    pub fn job(self, supervisor: &Supervisor) -> Result<(Job, Option<Handover>), PoolError> {
        let Some(mut runner) = self.runner else {
            let job = crate::read_job(std::io::stdin().lock()).map_err(|err| match err {
                InitError::Spec(err) => PoolError::Job(err),
                other => PoolError::Handover(std::io::Error::other(other.to_string())),
            })?;
            return Ok((job, None));
        };
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let line = spec::read_spec_line(std::io::stdin().lock(), spec::MAX_SPEC_LINE);
            let _ = sender.send(line);
            let _ = kill(Pid::this(), WAKE_SIGNAL);
        });
        let mut line = None;
        let ended = supervisor
            .until(&mut runner.child, || match receiver.try_recv() {
                Ok(received) => {
                    line = Some(received);
                    true
                }
                Err(_) => false,
            })
            .map_err(PoolError::Wait)?;
        if let Some(outcome) = ended {
            return Err(PoolError::RunnerDied(outcome));
        }
        let line = line
            .ok_or(PoolError::Job(SpecError::Empty))?
            .map_err(PoolError::Job)?;
        let job = spec::parse_job(&line).map_err(PoolError::Job)?;
        Ok((job, Some(runner)))
    }
}

impl Handover {
    /// Gives the runner the program to run (it runs `argv[1]`), and returns it to supervise,
    /// with the relay of its output.
    pub fn hand_over(
        mut self,
        argv: &[String],
        cwd: &Path,
        env: Option<BTreeMap<String, String>>,
    ) -> Result<(Child, Relaying), PoolError> {
        let job = RunnerJob {
            argv: argv.to_vec(),
            cwd: cwd.to_string_lossy().into_owned(),
            env: env.unwrap_or_else(|| std::env::vars().collect()),
        };
        let mut line = serde_json::to_vec(&job)
            .map_err(|err| PoolError::Handover(std::io::Error::other(err)))?;
        line.push(b'\n');
        self.stdin.write_all(&line).map_err(PoolError::Handover)?;
        drop(self.stdin);
        Ok((self.child, self.relaying))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &[&str]) -> Result<Runner, InitError> {
        Runner::parse(list.iter().map(OsString::from))
    }

    #[test]
    fn runners_and_their_modules() {
        assert_eq!(parse(&[]).unwrap(), Runner::Plain);
        assert_eq!(
            parse(&["python", "numpy", "matplotlib.pyplot"]).unwrap(),
            Runner::Python {
                preload: vec!["numpy".into(), "matplotlib.pyplot".into()]
            }
        );
        for bad in [
            &["ruby"][..],
            &["python", "os;rm"],
            &["python", ""],
            &["python", "a..b"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
