//! `sandbox-init` binary: see the library docs for the protocol and exit codes.

use std::process::ExitCode;

use sandbox_init::streams::{self, Host};
use sandbox_init::{End, InitError, Mode};

fn main() -> ExitCode {
    let mut end = End::default();
    let result =
        sandbox_init::parse_args(std::env::args_os().skip(1)).and_then(|mode| match mode {
            Mode::Init => sandbox_init::run(None, &mut end),
            Mode::Pool(runner) => sandbox_init::run(Some(runner), &mut end),
            Mode::Session { runner, context } => {
                sandbox_init::run_session(runner, context, &mut end)
            }
            Mode::Attach { pty: None, argv } => {
                sandbox_init::attach::attach(&argv).map_err(InitError::Attach)
            }
            Mode::Attach {
                pty: Some(size),
                argv,
            } => sandbox_init::pty::attach(&argv, size).map_err(InitError::Attach),
            Mode::Watch { recursive, path } => {
                sandbox_init::watch::watch(&path, recursive).map_err(InitError::Watch)
            }
            Mode::Signal { tag, signal } => {
                sandbox_init::attach::signal(&tag, signal).map_err(InitError::Attach)
            }
            // Returns only if the exec failed.
            Mode::Exec {
                tty: true, argv, ..
            } => sandbox_init::pty::keep(&argv).map_err(InitError::Attach),
            Mode::Exec { apart, argv, .. } => {
                Err(InitError::Exec(sandbox_init::exec::exec(&argv, apart)))
            }
        });
    let code = match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("sandgate-init: {err}");
            err.exit_code()
        }
    };
    if let Some(nonce) = &end.nonce {
        if end.quiet {
            let _ = streams::write_all(Host::Stdout, &sandbox_init::end_marker(nonce, code, ""));
        }
        let trailer = sandbox_init::exit_trailer(nonce, code, &end.report);
        let _ = streams::write_all(Host::Stderr, &trailer);
    }
    ExitCode::from(code)
}
