//! The `sandgate` binary: starts tracing, parses arguments, loads the config, starts the one
//! async runtime and hands the command to its module in `gateway::cli`; a failure is printed
//! as `sandgate: <error>` and exits 1.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use gateway::cli::{self, Cli, Command};
use gateway::config::Config;

fn main() -> ExitCode {
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, not in files, pipes or journald.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    warn_unknown_env_vars();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("sandgate: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// A `SANDGATE_*` variable nothing reads is most likely a typo: say so, with the known names.
fn warn_unknown_env_vars() {
    let names = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok());
    for var in gateway::config::unknown_env_vars(names) {
        tracing::warn!(
            variable = %var,
            known = %gateway::config::known_env_vars().join(", "),
            "{var} is set but sandgate reads no such variable; ignored"
        );
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = Config::load(cli.config.as_deref(), |key| std::env::var(key).ok())?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    match cli.command {
        Command::Serve => runtime.block_on(cli::serve::run(config)),
        Command::Keys { command } => runtime.block_on(cli::keys::run(command, &config)),
        Command::Policy { command } => runtime.block_on(cli::policy::run(command, &config)),
        Command::Audit { command } => runtime.block_on(cli::audit::run(command, &config)),
        Command::Exec(args) => runtime.block_on(cli::exec::run(args, &config)),
        Command::Mcp(args) => runtime.block_on(cli::mcp::run(args, &config)),
        Command::Repl(args) => cli::repl::run(args, &config, &runtime),
    }
}
