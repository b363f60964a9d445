//! `sandbox-init` binary: see the library docs for the protocol and exit codes.

use std::process::ExitCode;

use sandbox_init::{InitError, Mode};

fn main() -> ExitCode {
    let result =
        sandbox_init::parse_args(std::env::args_os().skip(1)).and_then(|mode| match mode {
            Mode::Init => sandbox_init::run(std::io::stdin().lock()),
            // Returns only if the exec failed.
            Mode::Exec(argv) => Err(InitError::Exec(sandbox_init::exec::exec(&argv))),
        });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("sandgate-init: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}
