//! The `sandgate` command line, one module per subcommand or family (gVisor's `runsc/cmd`):
//! each holds its clap arguments and one `run` that does the work and says how to exit.
//! `main.rs` parses, loads the config, starts the one async runtime and dispatches here.
//!
//! - [`serve`]: the gateway itself; [`keys`], [`policy`], [`audit`]: operator commands on the
//!   configured database and bundle (or, for `policy reload|rollback`, the running gateway);
//! - [`exec`], [`repl`], [`mcp`]: clients of a running gateway's HTTP API (`client/`, `mcp/`).

pub mod audit;
pub mod exec;
pub mod keys;
pub mod mcp;
pub mod policy;
pub mod repl;
pub mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::client::TlsFiles;
use crate::config::Config;

#[derive(Parser)]
#[command(
    name = "sandgate",
    version,
    about = "Runs untrusted code in gVisor sandboxes under Rego policy"
)]
pub struct Cli {
    /// Config file (YAML); every key can also be set as SANDGATE_<KEY>.
    #[arg(long, global = true, env = "SANDGATE_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the gateway.
    Serve,
    /// Manage API keys.
    Keys {
        #[command(subcommand)]
        command: keys::KeysCommand,
    },
    /// Work with the policy bundle.
    Policy {
        #[command(subcommand)]
        command: policy::PolicyCommand,
    },
    /// Check the audit trail.
    Audit {
        #[command(subcommand)]
        command: audit::AuditCommand,
    },
    /// Run a program through a gateway and print its output as it arrives; exits with the
    /// program's exit code (124 timeout, 137 oom or killed, 130 cancelled, 77 denied, 70 error).
    Exec(exec::ExecArgs),
    /// Serve the MCP tool `run_code` over stdio (one JSON-RPC message per line), sending each
    /// call to a gateway, where it is decided and audited like any execution.
    Mcp(mcp::McpArgs),
    /// An interactive session in the terminal: each cell typed runs in one sandbox that keeps
    /// its state (variables, imports, files); Ctrl-C interrupts the running code, Ctrl-D
    /// closes the session. Piped stdin is read line by line, without prompts.
    Repl(repl::ReplArgs),
}

/// How `sandgate exec` and `sandgate repl` reach a gateway as an agent.
#[derive(clap::Args)]
pub struct AgentConnection {
    /// The gateway (default: http:// + the configured listen address).
    #[arg(long, env = "SANDGATE_URL")]
    url: Option<String>,
    /// An agent API key (or set SANDGATE_KEY, which keeps it out of the process list).
    #[arg(long, env = "SANDGATE_KEY", hide_env_values = true)]
    key: Option<String>,
    #[command(flatten)]
    tls: ClientTls,
}

impl AgentConnection {
    /// The gateway's URL and the key; fails, saying how to get one, without a key.
    fn url_and_key(self, config: &Config) -> anyhow::Result<(String, String, TlsFiles)> {
        let key = self.key.context(NO_KEY)?;
        Ok((gateway_url(self.url, config), key, self.tls.files()))
    }
}

/// The TLS files of a client of an `https://` gateway.
#[derive(clap::Args)]
pub struct ClientTls {
    /// A CA certificate (PEM) to trust for an https:// gateway, beside the system roots.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// A client certificate (PEM) to present to an https:// gateway that requires one
    /// (`tls.client_ca_file`); with --client-key.
    #[arg(long, requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// The private key (PEM) of --client-cert.
    #[arg(long, requires = "client_cert")]
    client_key: Option<PathBuf>,
}

impl ClientTls {
    fn files(self) -> TlsFiles {
        TlsFiles {
            ca_file: self.ca_file,
            client_cert: self.client_cert.zip(self.client_key),
        }
    }
}

const NO_KEY: &str = "no API key: set SANDGATE_KEY (export SANDGATE_KEY=sgk_...) or pass --key; \
                      an admin creates one with `sandgate keys create --role agent --tenant NAME`";

/// `--url`, or `http://` and the configured listen address.
fn gateway_url(url: Option<String>, config: &Config) -> String {
    url.unwrap_or_else(|| format!("http://{}", config.listen))
}

/// `--net host:port` values.
fn destinations(specs: &[String]) -> anyhow::Result<Vec<(String, u16)>> {
    let mut network = Vec::new();
    for destination in specs {
        let (host, port) = destination
            .rsplit_once(':')
            .with_context(|| format!("--net {destination}: expected host:port"))?;
        let port = port
            .parse()
            .with_context(|| format!("--net {destination}: bad port"))?;
        network.push((host.to_owned(), port));
    }
    Ok(network)
}

/// A client's exit code (a program's, or one of the documented endings) as the process's;
/// one that does not fit a byte is a failure.
fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
