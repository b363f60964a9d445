//! The `sandgate` binary: parses arguments, loads config, starts tracing, calls the library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;

use gateway::config::Config;

#[derive(Parser)]
#[command(
    name = "sandgate",
    version,
    about = "Runs untrusted code in gVisor sandboxes under Rego policy"
)]
struct Cli {
    /// Config file (YAML); every key can also be set as SANDGATE_<KEY>.
    #[arg(long, global = true, env = "SANDGATE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve,
    /// Manage API keys.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Work with the policy bundle.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Create a key; it is printed once, as the last line of stdout.
    Create {
        #[arg(long, value_enum)]
        role: Role,
        #[arg(long)]
        tenant: String,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Print the decision for one input (JSON or YAML file), without running anything.
    Eval {
        #[arg(long)]
        input: PathBuf,
        /// Policy directory (default: the configured policy_dir).
        #[arg(long)]
        policy_dir: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Role {
    Agent,
    Reviewer,
    Auditor,
    Admin,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Reviewer => "reviewer",
            Role::Auditor => "auditor",
            Role::Admin => "admin",
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sandgate: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let config = Config::load(cli.config.as_deref(), |key| std::env::var(key).ok())?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        match cli.command {
            Command::Serve => {
                let shutdown = CancellationToken::new();
                tokio::spawn(cancel_on_signal(shutdown.clone()));
                gateway::serve(config, shutdown).await?;
            }
            Command::Keys {
                command: KeysCommand::Create { role, tenant },
            } => {
                let key = gateway::create_key(&config, role.as_str(), &tenant).await?;
                println!(
                    "created {} key {} for tenant {tenant}",
                    role.as_str(),
                    key.id
                );
                println!("{}", key.secret);
            }
            Command::Policy {
                command: PolicyCommand::Eval { input, policy_dir },
            } => {
                let dir = policy_dir.unwrap_or(config.policy_dir);
                let engine = policy_engine::PolicyEngine::load(&dir)
                    .with_context(|| format!("loading the policy bundle in {}", dir.display()))?;
                let text = std::fs::read_to_string(&input)
                    .with_context(|| format!("reading {}", input.display()))?;
                let value: serde_json::Value = serde_yaml_ng::from_str(&text)
                    .with_context(|| format!("parsing {}", input.display()))?;
                let decision = engine.decide_json(&value);
                println!("{}", serde_json::to_string_pretty(&decision)?);
            }
        }
        Ok(())
    })
}

/// SIGTERM or SIGINT starts a graceful shutdown.
async fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("signal received: shutting down");
    shutdown.cancel();
}
