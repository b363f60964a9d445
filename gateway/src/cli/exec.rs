//! `sandgate exec`: one program through a gateway (`client::exec_until`), its output printed
//! as it arrives; Ctrl-C cancels the execution on the gateway, a second Ctrl-C stops waiting
//! for it to end.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::AgentConnection;
use crate::client::save::SaveOptions;
use crate::client::{ExecRequest, EXIT_CANCELLED};
use crate::config::Config;

#[derive(clap::Args)]
pub struct ExecArgs {
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
    #[command(flatten)]
    connection: AgentConnection,
}

pub async fn run(args: ExecArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let request = request(args, config)?;
    // Caught only once the program is read: a Ctrl-C while it is typed on stdin still quits.
    let (cancel, give_up) = (CancellationToken::new(), CancellationToken::new());
    let interrupts = signal(SignalKind::interrupt()).context("catching Ctrl-C (SIGINT)")?;
    let watch = tokio::spawn(on_interrupts(interrupts, [cancel.clone(), give_up.clone()]));
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let ran = tokio::select! {
        ran = crate::client::exec_until(&request, &mut stdout, &mut stderr, &cancel) => ran,
        () = give_up.cancelled() => {
            eprintln!("sandgate: not waiting for the execution to end");
            Ok(EXIT_CANCELLED)
        }
    };
    watch.abort();
    Ok(super::exit_code(ran?))
}

/// The first Ctrl-C fires the first token (cancel the execution, then wait for the gateway to
/// record its end), a second one the second (leave at once, for a gateway that does not answer).
async fn on_interrupts(mut interrupts: Signal, tokens: [CancellationToken; 2]) {
    for token in tokens {
        if interrupts.recv().await.is_none() {
            return;
        }
        token.cancel();
    }
}

/// What to send: the program, the files to upload, the grants to ask for.
fn request(args: ExecArgs, config: &Config) -> anyhow::Result<ExecRequest> {
    let (url, key, tls) = args.connection.url_and_key(config)?;
    let code = if args.file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the program from stdin")?
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let mut files = Vec::new();
    for spec in &args.file_in {
        files.push(file_in(spec)?);
    }
    Ok(ExecRequest {
        url,
        key,
        tls,
        language: args.lang,
        code,
        files,
        network: super::destinations(&args.net)?,
        mounts: args.mount,
        timeout_ms: args.timeout_ms,
        output_dir: args.output_dir,
        session: args.session,
        save: SaveOptions {
            force: args.force,
            allow_dotfiles: args.allow_dotfiles,
        },
    })
}

/// `--file-in PATH[=NAME]`: the name under /workspace and the content.
fn file_in(spec: &str) -> anyhow::Result<(String, Vec<u8>)> {
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
    let content = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok((name, content))
}
