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
    /// Check the audit trail.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Run a program through a gateway and print its output as it arrives; exits with the
    /// program's exit code (124 timeout, 137 oom or killed, 130 cancelled, 77 denied, 70 error).
    Exec(ExecArgs),
}

#[derive(clap::Args)]
struct ExecArgs {
    /// The program (`-` for stdin).
    #[arg(long)]
    file: PathBuf,
    #[arg(long, default_value = "python")]
    lang: String,
    /// A file to upload into /workspace under its own name (repeatable); `PATH=NAME` names it.
    #[arg(long = "file-in")]
    file_in: Vec<String>,
    /// A network destination to ask for, `host:port` (repeatable).
    #[arg(long)]
    net: Vec<String>,
    /// A mount to ask for, e.g. `dataset:census` (repeatable).
    #[arg(long)]
    mount: Vec<String>,
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// Download the files the program wrote to /output into this directory.
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Run in this open session (`POST /v1/sessions`) instead of a sandbox of its own; prints
    /// the final expression's `repr` after the output.
    #[arg(long)]
    session: Option<String>,
    /// The gateway (default: http:// + the configured listen address).
    #[arg(long, env = "SANDGATE_URL")]
    url: Option<String>,
    /// An agent API key.
    #[arg(long, env = "SANDGATE_KEY", hide_env_values = true)]
    key: String,
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Walk the hash chain: prints `ok N events` or the first broken event (exit 1).
    Verify,
    /// Print the hash of the last event, to anchor outside the database.
    Head,
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Create a key; it is printed once, as the last line of stdout.
    Create {
        #[arg(long, value_enum)]
        role: Role,
        #[arg(long)]
        tenant: String,
        /// The person or system behind the key (default: the key's own id). A reviewer key
        /// cannot approve requests made by a key of the same principal.
        #[arg(long)]
        principal: Option<String>,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Run the YAML decision cases in DIR/tests; print failures, line coverage and
    /// "N passed, N failed". Exits non-zero on a failure or coverage under the minimum.
    Test {
        /// Policy directory (default: the configured policy_dir).
        dir: Option<PathBuf>,
        /// Minimum line coverage, in percent, over all .rego files.
        #[arg(long, default_value_t = 0.0)]
        min_coverage: f64,
    },
    /// Print the decision for one input (JSON or YAML file), without running anything.
    Eval {
        #[arg(long)]
        input: PathBuf,
        /// Policy directory (default: the configured policy_dir).
        #[arg(long)]
        policy_dir: Option<PathBuf>,
        /// Entry point: `execution` (sandgate.execution) or `egress` (sandgate.egress).
        #[arg(long, default_value = "execution")]
        entry_point: String,
    },
    /// Re-decide past execution decisions with a candidate bundle and print what would change.
    Replay {
        /// How far back: 7d, 24h, 30m, 90s.
        #[arg(long, default_value = "7d")]
        since: String,
        /// Candidate policy directory (default: the configured policy_dir).
        #[arg(long)]
        policy_dir: Option<PathBuf>,
        /// How many changed cases to print.
        #[arg(long, default_value_t = 20)]
        first: usize,
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
    match main_exit(Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("sandgate: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn main_exit(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = Config::load(cli.config.as_deref(), |key| std::env::var(key).ok())?;
    if let Command::Exec(args) = cli.command {
        let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
        let code = runtime.block_on(exec(args, &config))?;
        return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
    }
    run(cli.command, config)?;
    Ok(ExitCode::SUCCESS)
}

async fn exec(args: ExecArgs, config: &Config) -> anyhow::Result<i32> {
    let code = if args.file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the program from stdin")?
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let mut files = Vec::new();
    for spec in &args.file_in {
        let (path, name) = match spec.split_once('=') {
            Some((path, name)) => (PathBuf::from(path), name.to_owned()),
            None => {
                let path = PathBuf::from(spec);
                let name = path
                    .file_name()
                    .with_context(|| format!("--file-in {spec}: no file name"))?
                    .to_string_lossy()
                    .into_owned();
                (path, name)
            }
        };
        let content =
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        files.push((name, content));
    }
    let mut network = Vec::new();
    for destination in &args.net {
        let (host, port) = destination
            .rsplit_once(':')
            .with_context(|| format!("--net {destination}: expected host:port"))?;
        let port = port
            .parse()
            .with_context(|| format!("--net {destination}: bad port"))?;
        network.push((host.to_owned(), port));
    }
    let request = gateway::client::ExecRequest {
        url: args
            .url
            .unwrap_or_else(|| format!("http://{}", config.listen)),
        key: args.key,
        language: args.lang,
        code,
        files,
        network,
        mounts: args.mount,
        timeout_ms: args.timeout_ms,
        output_dir: args.output_dir,
        session: args.session,
    };
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    gateway::client::exec(&request, &mut stdout, &mut stderr).await
}

fn run(command: Command, config: Config) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        match command {
            Command::Serve => {
                let shutdown = CancellationToken::new();
                tokio::spawn(cancel_on_signal(shutdown.clone()));
                gateway::serve(config, shutdown).await?;
            }
            Command::Keys {
                command:
                    KeysCommand::Create {
                        role,
                        tenant,
                        principal,
                    },
            } => {
                let key = gateway::commands::create_key_for(
                    &config,
                    role.as_str(),
                    &tenant,
                    principal.as_deref(),
                )
                .await?;
                println!(
                    "created {} key {} for tenant {tenant}, principal {}",
                    role.as_str(),
                    key.id,
                    principal.as_deref().unwrap_or(&key.id)
                );
                println!("{}", key.secret);
            }
            Command::Policy { command } => policy(command, &config).await?,
            Command::Exec(_) => unreachable!("handled in main_exit"),
            Command::Audit { command } => {
                let verification = gateway::commands::audit_verify(&config).await?;
                match command {
                    AuditCommand::Verify => {
                        println!("{}", verification.summary());
                        if !verification.ok() {
                            anyhow::bail!("the audit chain is broken");
                        }
                    }
                    AuditCommand::Head => match (&verification.head, verification.ok()) {
                        (Some(head), true) => println!("{} {head}", verification.events),
                        (None, true) => println!("0 (empty chain)"),
                        (_, false) => anyhow::bail!("{}", verification.summary()),
                    },
                }
            }
        }
        Ok(())
    })
}

async fn policy(command: PolicyCommand, config: &Config) -> anyhow::Result<()> {
    match command {
        PolicyCommand::Test { dir, min_coverage } => {
            let dir = dir.unwrap_or_else(|| config.policy_dir.clone());
            let outcome = gateway::commands::policy_test(&dir)?;
            print!("{}", outcome.report.render());
            if !outcome.ok(min_coverage) {
                anyhow::bail!(
                    "{} failed, line coverage {:.1}% (minimum {min_coverage}%)",
                    outcome.report.failed(),
                    outcome.coverage
                );
            }
        }
        PolicyCommand::Eval {
            input,
            policy_dir,
            entry_point,
        } => {
            let dir = policy_dir.unwrap_or_else(|| config.policy_dir.clone());
            let engine = gateway::commands::load(&dir)?;
            let text = std::fs::read_to_string(&input)
                .with_context(|| format!("reading {}", input.display()))?;
            let value: serde_json::Value = serde_yaml_ng::from_str(&text)
                .with_context(|| format!("parsing {}", input.display()))?;
            let decision = match entry_point.as_str() {
                "execution" => serde_json::to_value(engine.decide_json(&value))?,
                "egress" => {
                    let input: policy_engine::EgressInput = serde_json::from_value(value)
                        .with_context(|| format!("{} is not an egress input", input.display()))?;
                    serde_json::to_value(engine.decide_egress(&input))?
                }
                other => anyhow::bail!("unknown entry point {other:?}: execution or egress"),
            };
            println!("{}", serde_json::to_string_pretty(&decision)?);
        }
        PolicyCommand::Replay {
            since,
            policy_dir,
            first,
        } => {
            let dir = policy_dir.unwrap_or_else(|| config.policy_dir.clone());
            let (revision, report) = gateway::commands::policy_replay(config, &dir, &since).await?;
            print!("{}", report.render(&revision, first));
        }
    }
    Ok(())
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
