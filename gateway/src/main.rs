//! The `sandgate` binary: parses arguments, loads config, starts tracing, calls the library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;

use gateway::config::Config;
use gateway::role::Role;

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
    /// Serve the MCP tool `run_code` over stdio (one JSON-RPC message per line), sending each
    /// call to a gateway, where it is decided and audited like any execution.
    Mcp(McpArgs),
    /// An interactive session in the terminal: each cell typed runs in one sandbox that keeps
    /// its state (variables, imports, files); Ctrl-C interrupts the running code, Ctrl-D
    /// closes the session. Piped stdin is read line by line, without prompts.
    Repl(ReplArgs),
}

#[derive(clap::Args)]
struct ReplArgs {
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
    /// The gateway (default: http:// + the configured listen address).
    #[arg(long, env = "SANDGATE_URL")]
    url: Option<String>,
    /// An agent API key (or set SANDGATE_KEY, which keeps it out of the process list).
    #[arg(long, env = "SANDGATE_KEY", hide_env_values = true)]
    key: Option<String>,
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

#[derive(clap::Args)]
struct McpArgs {
    /// The gateway (default: http:// + the configured listen address).
    #[arg(long, env = "SANDGATE_URL")]
    url: Option<String>,
    /// An agent API key.
    #[arg(long, env = "SANDGATE_KEY", hide_env_values = true)]
    key: String,
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

#[derive(clap::Args)]
struct ExecArgs {
    /// The program (`-` for stdin).
    #[arg(long)]
    file: PathBuf,
    /// The language to run it as: python or bash (the gateway's configured `images`).
    #[arg(long, default_value = "python", value_name = "python|bash")]
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
    /// Wall-time limit to ask for, in milliseconds (the policy and the configured ceilings
    /// may lower it; default: the policy's).
    #[arg(long, value_name = "MS")]
    timeout_ms: Option<u64>,
    /// Download the files the program wrote to /output into this directory: only as new
    /// regular files (never through a symlink, never over an existing file), no dot-files.
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Run in this open session (`POST /v1/sessions`) instead of a sandbox of its own; prints
    /// the final expression's `repr` after the output.
    #[arg(long)]
    session: Option<String>,
    /// With --output-dir: replace existing regular files of the same name.
    #[arg(long, requires = "output_dir")]
    force: bool,
    /// With --output-dir: also write names with a component starting with `.`.
    #[arg(long, requires = "output_dir")]
    allow_dotfiles: bool,
    /// The gateway (default: http:// + the configured listen address).
    #[arg(long, env = "SANDGATE_URL")]
    url: Option<String>,
    /// An agent API key (or set SANDGATE_KEY, which keeps it out of the process list).
    #[arg(long, env = "SANDGATE_KEY", hide_env_values = true)]
    key: Option<String>,
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

#[derive(Subcommand)]
enum AuditCommand {
    /// Walk the hash chain: prints `ok N events` or the first broken event (exit 1). With
    /// --bundle, check an exported bundle offline instead (no database): `ok ...`, or exit 1 with
    /// the first problem, or `unproven ...` (exit 1) when it holds links it cannot recompute.
    Verify {
        /// A bundle written by `sandgate audit export`.
        #[arg(long)]
        bundle: Option<PathBuf>,
        /// A head kept earlier, as `sandgate audit head` prints it (SEQ:HASH): the bundle must
        /// reach event SEQ and that event must have HASH.
        #[arg(long, requires = "bundle")]
        head: Option<gateway::audit::bundle::check::Anchor>,
    },
    /// Write the events of a time window, the policy revisions they name (with their files)
    /// and a proof to one file, for `sandgate audit verify --bundle` to check offline.
    Export {
        /// From: an RFC 3339 time, or a span before now (7d, 24h, 30m).
        #[arg(long)]
        since: String,
        /// Until (exclusive), as --since; default: now.
        #[arg(long)]
        until: Option<String>,
        /// Only this tenant's events carry their content; the others are links only.
        #[arg(long)]
        tenant: Option<String>,
        /// jsonl (sandgate's rows) or ocsf (OCSF 1.3 records carrying the rows).
        #[arg(long, value_enum, default_value = "jsonl")]
        format: ExportFormat,
        /// The bundle to write (replaced when it exists).
        #[arg(long)]
        out: PathBuf,
    },
    /// Walk the chain and print its head as SEQ:HASH, to keep outside the database and give to
    /// `sandgate audit verify --bundle FILE --head SEQ:HASH`.
    Head,
    /// Open psql on the audit database as the read-only role sandgate_auditor (the embedded
    /// cluster's socket, or database_url with role=sandgate_auditor). Arguments after `--` go to
    /// psql, e.g. `sandgate audit psql -- -c 'SELECT * FROM v_denied_egress'`.
    Psql {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Create a key; it is printed once, as the last line of stdout.
    Create {
        #[arg(long, value_parser = parse_role)]
        role: Role,
        #[arg(long)]
        tenant: String,
        /// The person or system behind the key (default: the key's own id). A reviewer key
        /// cannot approve requests made by a key of the same principal.
        #[arg(long)]
        principal: Option<String>,
        /// The key stops working this long from now (30d, 12h, 90m); default: never.
        #[arg(long)]
        expires_in: Option<String>,
    },
    /// List keys (never their secrets or hashes): id, role, tenant, principal, state, expiry,
    /// last use.
    List {
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Revoke a key: it is refused from the next request on.
    Revoke { id: String },
    /// Replace a live key by a new one of the same role, tenant and principal, and revoke the
    /// old one; the new key is printed once, as the last line of stdout.
    Rotate {
        id: String,
        /// The new key stops working this long from now; default: never.
        #[arg(long)]
        expires_in: Option<String>,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Run the YAML decision cases in DIR/tests and check the golden decision matrix
    /// DIR/tests/decisions.out; print failures, line coverage, "N passed, N failed" and the
    /// matrix's changed lines. Exits non-zero on a failure, a matrix that differs, or coverage
    /// under the minimum.
    Test {
        /// Policy directory (default: the configured policy_dir).
        dir: Option<PathBuf>,
        /// Minimum line coverage, in percent, over all .rego files.
        #[arg(long, default_value_t = 0.0)]
        min_coverage: f64,
        /// Rewrite DIR/tests/decisions.out from the bundle's decisions instead of checking it
        /// (commit it with the policy change, for reviewers to read as a diff).
        #[arg(long)]
        bless: bool,
    },
    /// Print the decision for one input (JSON or YAML file) and the bundle's revision, as
    /// `{"revision", "entry_point", "decision"}`, without running anything.
    Eval {
        #[arg(long)]
        input: PathBuf,
        /// Policy directory (default: the configured policy_dir).
        #[arg(long)]
        policy_dir: Option<PathBuf>,
        /// Entry point: `execution` (sandgate.execution) or `egress` (sandgate.egress).
        #[arg(long, default_value = "execution")]
        entry_point: String,
        /// Exit 1 (after printing) when the decision denies, for scripts and CI.
        #[arg(long)]
        fail_on_deny: bool,
    },
    /// Ask the running gateway (admin key) to load a candidate bundle: the configured
    /// policy_dir again, or DIR (a path the gateway can read). It must load and pass its own
    /// test cases, or the active bundle stays (exit 1). Audited as `policy.reload`.
    Reload {
        /// Candidate directory, as the gateway sees it (made absolute here).
        #[arg(long, conflicts_with = "upload")]
        dir: Option<PathBuf>,
        /// Candidate directory here, sent to the gateway as a gzip'd tar (for a gateway on
        /// another machine).
        #[arg(long)]
        upload: Option<PathBuf>,
        /// Reload only while this revision is active (`If-Match`; else refused, 409).
        #[arg(long, conflicts_with = "upload")]
        if_match: Option<String>,
        #[command(flatten)]
        gateway: GatewayArgs,
    },
    /// Ask the running gateway (admin key) to activate a kept revision again: REVISION
    /// (`sha256:...`, listed by `GET /v1/policy` as `kept`) or the one before the current.
    Rollback {
        revision: Option<String>,
        #[command(flatten)]
        gateway: GatewayArgs,
    },
    /// Re-decide past execution decisions with a candidate bundle and print what would change.
    Replay {
        /// How far back: 7d, 24h, 30m, 90s.
        #[arg(long, default_value = "7d")]
        since: String,
        /// Candidate policy directory (default: the configured policy_dir).
        #[arg(long)]
        policy_dir: Option<PathBuf>,
        /// How many changed cases to print (text format).
        #[arg(long, default_value_t = 20)]
        first: usize,
        /// Exit 1 when a changed decision is of one of these kinds (comma-separated):
        /// allow-to-deny, review-to-allow, ... (any two of allow, review, deny), backend,
        /// network, limits, mounts, policy-error, any.
        #[arg(long, value_delimiter = ',', value_name = "CHANGE,...")]
        fail_on: Vec<gateway::app::replay::FailOn>,
        /// text (a summary and the first changed cases) or json (the whole report).
        #[arg(long, value_enum, default_value = "text")]
        format: ReportFormat,
    },
}

/// How an admin subcommand reaches the gateway.
#[derive(clap::Args)]
struct GatewayArgs {
    /// The gateway's URL (default: http:// and the configured listen address).
    #[arg(long, env = "SANDGATE_URL")]
    url: Option<String>,
    /// An admin API key.
    #[arg(long, env = "SANDGATE_KEY", hide_env_values = true)]
    key: Option<String>,
    /// A CA certificate (PEM) to trust for an https:// gateway, beside the system roots.
    #[arg(long)]
    ca_file: Option<PathBuf>,
}

/// What an admin subcommand sends.
enum AdminBody {
    /// A JSON body, and the revision for `If-Match` if any.
    Json(serde_json::Value, Option<String>),
    Bytes(&'static str, Vec<u8>),
}

/// `POST path` to the gateway as an admin; prints the outcome, fails on a refusal.
async fn admin_post(
    gateway: GatewayArgs,
    config: &Config,
    path: &str,
    body: AdminBody,
) -> anyhow::Result<()> {
    let key = gateway.key.context(
        "no API key: set SANDGATE_KEY or pass --key (an admin key: \
         `sandgate keys create --role admin --tenant ops`)",
    )?;
    let url = gateway
        .url
        .unwrap_or_else(|| format!("http://{}", config.listen));
    let tls = tls_files(gateway.ca_file, None, None);
    let remote = gateway::mcp::remote::Remote::new(&url, &key, &tls)?;
    let sent = match body {
        AdminBody::Json(body, if_match) => {
            remote
                .post_json_if_match(path, &body, if_match.as_deref())
                .await
        }
        AdminBody::Bytes(content_type, bytes) => remote.post_bytes(path, content_type, bytes).await,
    };
    let (status, answer) = sent.map_err(|message| anyhow::anyhow!(message))?;
    let status = reqwest::StatusCode::from_u16(status)?;
    if status.is_success() {
        let accepted: api_types::PolicyAccepted = serde_json::from_slice(&answer)
            .context("the gateway accepted the policy but its answer is not readable")?;
        println!(
            "accepted revision {} (previous {})",
            accepted.revision, accepted.previous
        );
        return Ok(());
    }
    let refused = gateway::client::sessions::api_error(status, &answer);
    if let gateway::client::sessions::CallError::Api { reasons, .. } = &refused {
        for reason in reasons {
            eprintln!("{}: {}", reason.code, reason.message);
        }
    }
    Err(refused.into())
}

#[derive(Clone, Copy, ValueEnum)]
enum ExportFormat {
    Jsonl,
    Ocsf,
}

#[derive(Clone, Copy, ValueEnum)]
enum ReportFormat {
    Text,
    Json,
}

/// `--role`: one of the API's closed set of roles (api-types), spelt as keys store it.
fn parse_role(text: &str) -> Result<Role, String> {
    Role::parse(text).ok_or_else(|| {
        let names: Vec<&str> = Role::ALL.iter().map(|role| role.as_str()).collect();
        format!("one of: {}", names.join(", "))
    })
}

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
    match main_exit(Cli::parse()) {
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

fn main_exit(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = Config::load(cli.config.as_deref(), |key| std::env::var(key).ok())?;
    if let Command::Exec(args) = cli.command {
        let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
        let code = runtime.block_on(exec(args, &config))?;
        return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
    }
    if let Command::Repl(args) = cli.command {
        return repl(args, &config).map(|code| ExitCode::from(u8::try_from(code).unwrap_or(1)));
    }
    if let Command::Audit {
        command: AuditCommand::Psql { args },
    } = &cli.command
    {
        let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
        let code = runtime.block_on(gateway::commands::audit_psql(&config, args))?;
        return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
    }
    if let Command::Mcp(args) = cli.command {
        let url = args
            .url
            .unwrap_or_else(|| format!("http://{}", config.listen));
        let tls = tls_files(args.ca_file, args.client_cert, args.client_key);
        let remote = gateway::mcp::remote::Remote::new(&url, &args.key, &tls)?;
        let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
        runtime
            .block_on(gateway::mcp::stdio::serve(
                &remote,
                tokio::io::stdin(),
                tokio::io::stdout(),
            ))
            .context("the MCP stdio transport failed")?;
        return Ok(ExitCode::SUCCESS);
    }
    run(cli.command, config)?;
    Ok(ExitCode::SUCCESS)
}

const NO_KEY: &str = "no API key: set SANDGATE_KEY (export SANDGATE_KEY=sgk_...) or pass --key; \
                      an admin creates one with `sandgate keys create --role agent --tenant NAME`";

fn tls_files(
    ca_file: Option<PathBuf>,
    client_cert: Option<PathBuf>,
    client_key: Option<PathBuf>,
) -> gateway::client::TlsFiles {
    gateway::client::TlsFiles {
        ca_file,
        client_cert: client_cert.zip(client_key),
    }
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

fn repl(args: ReplArgs, config: &Config) -> anyhow::Result<i32> {
    use api_types::{HostPort, SessionRequest};
    let key = args.key.context(NO_KEY)?;
    let url = args
        .url
        .unwrap_or_else(|| format!("http://{}", config.listen));
    let base = gateway::client::check_url(&url)?;
    let tls = tls_files(args.ca_file, args.client_cert, args.client_key);
    let client = gateway::client::sessions::SessionClient::new(
        gateway::client::http_client(&tls)?,
        base,
        &key,
    );
    let network = destinations(&args.net)?
        .into_iter()
        .map(|(host, port)| HostPort { host, port })
        .collect();
    let options = gateway::client::repl::ReplOptions {
        session: SessionRequest {
            language: args.lang,
            network,
            mounts: args.mount,
            idle_timeout_s: args.idle_timeout_s,
            ..SessionRequest::default()
        },
        timeout_ms: args.timeout_ms,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    gateway::client::repl::repl(&runtime, &client, &options)
}

async fn exec(args: ExecArgs, config: &Config) -> anyhow::Result<i32> {
    let key = args.key.clone().context(NO_KEY)?;
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
    let network = destinations(&args.net)?;
    let request = gateway::client::ExecRequest {
        url: args
            .url
            .unwrap_or_else(|| format!("http://{}", config.listen)),
        key,
        tls: tls_files(args.ca_file, args.client_cert, args.client_key),
        language: args.lang,
        code,
        files,
        network,
        mounts: args.mount,
        timeout_ms: args.timeout_ms,
        output_dir: args.output_dir,
        session: args.session,
        save: gateway::client::save::SaveOptions {
            force: args.force,
            allow_dotfiles: args.allow_dotfiles,
        },
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
            Command::Keys { command } => keys(command, &config).await?,
            Command::Policy { command } => policy(command, &config).await?,
            Command::Exec(_) | Command::Mcp(_) | Command::Repl(_) => {
                unreachable!("handled in main_exit")
            }
            Command::Audit { command } => audit(command, &config).await?,
        }
        Ok(())
    })
}

async fn audit(command: AuditCommand, config: &Config) -> anyhow::Result<()> {
    match command {
        AuditCommand::Verify {
            bundle: Some(bundle),
            head,
        } => match gateway::commands::audit_verify_bundle(&bundle, head)? {
            Ok(report) => {
                println!("{}", report.summary());
                if !report.proven() {
                    anyhow::bail!("{}: not proven (see above)", bundle.display());
                }
            }
            Err(problem) => anyhow::bail!("{}: {problem}", bundle.display()),
        },
        AuditCommand::Verify { bundle: None, .. } => {
            let verification = gateway::commands::audit_verify(config).await?;
            println!("{}", verification.summary());
            if !verification.ok() {
                anyhow::bail!("the audit chain is broken");
            }
        }
        AuditCommand::Head => {
            let verification = gateway::commands::audit_verify(config).await?;
            match (&verification.head, verification.ok()) {
                (Some(head), true) => println!("{}:{head}", verification.events),
                (None, true) => println!("0 (empty chain)"),
                (_, false) => anyhow::bail!("{}", verification.summary()),
            }
        }
        AuditCommand::Export {
            since,
            until,
            tenant,
            format,
            out,
        } => audit_export(since, until, tenant, format, &out, config).await?,
        AuditCommand::Psql { .. } => unreachable!("handled in main_exit"),
    }
    Ok(())
}

async fn audit_export(
    since: String,
    until: Option<String>,
    tenant: Option<String>,
    format: ExportFormat,
    out: &std::path::Path,
    config: &Config,
) -> anyhow::Result<()> {
    use gateway::audit::bundle::{EventFormat, ExportRequest};
    use gateway::commands::time_arg;
    let request = ExportRequest {
        since: time_arg("--since", &since)?,
        until: match until {
            Some(until) => time_arg("--until", &until)?,
            None => chrono::Utc::now(),
        },
        tenant,
        format: match format {
            ExportFormat::Jsonl => EventFormat::Jsonl,
            ExportFormat::Ocsf => EventFormat::Ocsf,
        },
    };
    let summary = gateway::commands::audit_export(config, &request, out).await?;
    let proof = &summary.proof;
    println!(
        "wrote {}: {} events, {} omitted, {} policy revisions; chain at export: {}",
        out.display(),
        proof.events,
        proof.omitted,
        summary.revisions,
        proof.chain.summary()
    );
    Ok(())
}

async fn keys(command: KeysCommand, config: &Config) -> anyhow::Result<()> {
    use gateway::commands;
    match command {
        KeysCommand::Create {
            role,
            tenant,
            principal,
            expires_in,
        } => {
            let expires_at = expires_in
                .as_deref()
                .map(commands::expiry_from_now)
                .transpose()?;
            let checked = gateway::app::keys::check_new_key(
                role.as_str(),
                &tenant,
                principal.as_deref(),
                expires_at,
            )
            .map_err(anyhow::Error::msg)?;
            if let Some(warning) = commands::tenant_warning(config, &tenant) {
                eprintln!("warning: {warning}");
            }
            let key = commands::create_checked_key(config, &checked).await?;
            let expiry = expires_at.map_or("never".to_owned(), |at| at.to_rfc3339());
            println!(
                "created {} key {} for tenant {tenant}, principal {}, expires {expiry}",
                role.as_str(),
                key.id,
                key.principal
            );
            println!("{}", key.secret);
        }
        KeysCommand::List { tenant } => {
            let now = chrono::Utc::now();
            let when = |at: Option<chrono::DateTime<chrono::Utc>>| {
                at.map_or("-".to_owned(), |at| at.to_rfc3339())
            };
            println!("ID\tROLE\tTENANT\tPRINCIPAL\tSTATE\tCREATED\tEXPIRES\tLAST_USED");
            for key in commands::list_keys(config, tenant.as_deref()).await? {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    key.id,
                    key.role,
                    key.tenant,
                    key.principal,
                    key.state(now),
                    key.created_at.to_rfc3339(),
                    when(key.expires_at),
                    when(key.last_used_at)
                );
            }
        }
        KeysCommand::Revoke { id } => match commands::revoke_key(config, &id).await? {
            gateway::audit::keys::Revoked::Now(_) => println!("revoked {id}"),
            gateway::audit::keys::Revoked::Already(_) => println!("{id} was already revoked"),
            gateway::audit::keys::Revoked::Unknown => anyhow::bail!("no key {id}"),
        },
        KeysCommand::Rotate { id, expires_in } => {
            let key = commands::rotate_key(config, &id, expires_in.as_deref()).await?;
            println!(
                "revoked {id}; created key {} for principal {}",
                key.id, key.principal
            );
            println!("{}", key.secret);
        }
    }
    Ok(())
}

async fn policy(command: PolicyCommand, config: &Config) -> anyhow::Result<()> {
    match command {
        PolicyCommand::Test {
            dir,
            min_coverage,
            bless,
        } => {
            let dir = dir.unwrap_or_else(|| config.policy_dir.clone());
            let outcome = gateway::commands::policy_test(&dir, bless)?;
            print!("{}", outcome.report.render());
            print!("{}", outcome.matrix_summary(&dir));
            if !outcome.ok(min_coverage) {
                anyhow::bail!(
                    "{} cases failed, decision matrix {}, line coverage {:.1}% (minimum {min_coverage}%)",
                    outcome.report.failed(),
                    match outcome.matrix {
                        policy_engine::matrix::MatrixCheck::Differs(_) => "differs",
                        _ => "ok",
                    },
                    outcome.coverage
                );
            }
        }
        PolicyCommand::Eval {
            input,
            policy_dir,
            entry_point,
            fail_on_deny,
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
            let allow = decision["allow"] == serde_json::Value::Bool(true);
            let answer = serde_json::json!({
                "revision": engine.revision(),
                "entry_point": entry_point,
                "decision": decision,
            });
            println!("{}", serde_json::to_string_pretty(&answer)?);
            if fail_on_deny && !allow {
                anyhow::bail!("the decision denies (--fail-on-deny)");
            }
        }
        PolicyCommand::Reload {
            upload: Some(upload),
            gateway,
            ..
        } => {
            let bytes = gateway::app::policy_upload::pack(&upload)
                .with_context(|| format!("packing {}", upload.display()))?;
            let body = AdminBody::Bytes("application/gzip", bytes);
            admin_post(gateway, config, "/v1/policy/reload", body).await?;
        }
        PolicyCommand::Reload {
            dir,
            gateway,
            if_match,
            ..
        } => {
            let body = match dir {
                Some(dir) => {
                    let dir = std::path::absolute(&dir)
                        .with_context(|| format!("--dir {}", dir.display()))?;
                    serde_json::json!({ "dir": dir })
                }
                None => serde_json::json!({}),
            };
            let body = AdminBody::Json(body, if_match);
            admin_post(gateway, config, "/v1/policy/reload", body).await?;
        }
        PolicyCommand::Rollback { revision, gateway } => {
            let body = match revision {
                Some(revision) => serde_json::json!({ "revision": revision }),
                None => serde_json::json!({}),
            };
            admin_post(
                gateway,
                config,
                "/v1/policy/rollback",
                AdminBody::Json(body, None),
            )
            .await?;
        }
        PolicyCommand::Replay {
            since,
            policy_dir,
            first,
            fail_on,
            format,
        } => {
            let dir = policy_dir.unwrap_or_else(|| config.policy_dir.clone());
            let (revision, report) = gateway::commands::policy_replay(config, &dir, &since).await?;
            match format {
                ReportFormat::Text => print!("{}", report.render(&revision, first)),
                ReportFormat::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "candidate": revision,
                        "report": report,
                    }))?
                ),
            }
            let failures = report.failures(&fail_on);
            if failures > 0 {
                anyhow::bail!("{failures} changed decisions match --fail-on");
            }
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
