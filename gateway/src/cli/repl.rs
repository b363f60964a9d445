//! `sandgate repl`: an interactive session in the terminal (`client::repl`).

use std::process::ExitCode;

use api_types::{HostPort, SessionRequest};

use super::AgentConnection;
use crate::client::repl::ReplOptions;
use crate::client::sessions::SessionClient;
use crate::config::Config;

#[derive(clap::Args)]
pub struct ReplArgs {
    /// The session's language: python or bash (the gateway's configured `images`).
    #[arg(long, default_value = "python", value_name = "python|bash")]
    lang: String,
    /// A network destination to ask for, `host:port` (repeatable; decided when the session
    /// opens).
    #[arg(long)]
    net: Vec<String>,
    /// A mount to ask for, e.g. `dataset:census` (repeatable).
    #[arg(long)]
    mount: Vec<String>,
    /// Wall-time limit of each cell, in milliseconds (default: the policy's).
    #[arg(long, value_name = "MS")]
    timeout_ms: Option<u64>,
    /// Close the session after this many idle seconds (capped by the gateway's ceiling).
    #[arg(long, value_name = "S")]
    idle_timeout_s: Option<u64>,
    #[command(flatten)]
    connection: AgentConnection,
}

/// Unlike the other commands, the repl is not async: the line editor blocks the calling
/// thread, so it drives each call on `runtime` itself.
pub fn run(
    args: ReplArgs,
    config: &Config,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<ExitCode> {
    let (url, key, tls) = args.connection.url_and_key(config)?;
    let base = crate::client::check_url(&url)?;
    let client = SessionClient::new(crate::client::http_client(&tls)?, base, &key);
    let network = super::destinations(&args.net)?
        .into_iter()
        .map(|(host, port)| HostPort { host, port })
        .collect();
    let options = ReplOptions {
        session: SessionRequest {
            language: args.lang,
            network,
            mounts: args.mount,
            idle_timeout_s: args.idle_timeout_s,
            ..SessionRequest::default()
        },
        timeout_ms: args.timeout_ms,
    };
    let code = crate::client::repl::repl(runtime, &client, &options)?;
    Ok(super::exit_code(code))
}
