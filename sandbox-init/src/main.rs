//! `sandbox-init` binary: see the library docs for the protocol and exit codes.

use std::io::Write;
use std::process::ExitCode;

use sandbox_init::{InitError, Mode, EXIT_TRAILER_PREFIX};

fn main() -> ExitCode {
    let mut report_exit = false;
    let result =
        sandbox_init::parse_args(std::env::args_os().skip(1)).and_then(|mode| match mode {
            Mode::Init {
                report_exit: report,
            } => {
                report_exit = report;
                sandbox_init::run(std::io::stdin().lock())
            }
            // Returns only if the exec failed.
            Mode::Exec(argv) => Err(InitError::Exec(sandbox_init::exec::exec(&argv))),
        });
    let code = match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("sandgate-init: {err}");
            err.exit_code()
        }
    };
    if report_exit {
        let mut trailer = EXIT_TRAILER_PREFIX.to_vec();
        trailer.extend_from_slice(format!("{code}\n").as_bytes());
        let _ = std::io::stderr().lock().write_all(&trailer);
    }
    ExitCode::from(code)
}
