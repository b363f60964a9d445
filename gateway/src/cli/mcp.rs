//! `sandgate mcp`: the MCP tools over stdio, each call sent to a gateway's HTTP API
//! (`mcp::remote`), where it is decided and audited like any execution.

use std::process::ExitCode;

use anyhow::Context;

use super::ClientTls;
use crate::config::Config;
use crate::mcp::remote::Remote;

#[derive(clap::Args)]
pub struct McpArgs {
    /// The gateway (default: http:// + the configured listen address).
    #[arg(long, env = "SANDGATE_URL")]
    url: Option<String>,
    /// An agent API key.
    #[arg(long, env = "SANDGATE_KEY", hide_env_values = true)]
    key: String,
    #[command(flatten)]
    tls: ClientTls,
}

pub async fn run(args: McpArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let url = super::gateway_url(args.url, config);
    let remote = Remote::new(&url, &args.key, &args.tls.files())?;
    crate::mcp::stdio::serve(&remote, tokio::io::stdin(), tokio::io::stdout())
        .await
        .context("the MCP stdio transport failed")?;
    Ok(ExitCode::SUCCESS)
}
