//! `sandgate audit verify|export|head|psql`: the audit trail in the configured database, or an
//! exported bundle checked offline.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Subcommand, ValueEnum};

use crate::app::replay;
use crate::audit::bundle::check::{self, Anchor, Anchors, BundleError, BundleReport, StartAnchor};
use crate::audit::bundle::{EventFormat, ExportRequest, ExportSummary};
use crate::audit::verify::Verification;
use crate::audit::AuditStore;
use crate::config::Config;
use crate::database::Database;

#[derive(Subcommand)]
pub enum AuditCommand {
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
        head: Option<Anchor>,
        /// Where the bundle must start (SEQ:HASH): right after event SEQ, whose hash is HASH,
        /// such as the last event of the previous bundle checked (`0`: the chain's start). The
        /// bundle must hold event SEQ+1, linked to HASH: none of the events after SEQ is missing
        /// from its start.
        #[arg(long, requires = "bundle")]
        from: Option<StartAnchor>,
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

#[derive(Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    Jsonl,
    Ocsf,
}

/// Exits 1 on a broken chain or bundle; `psql` exits with psql's code.
pub async fn run(command: AuditCommand, config: &Config) -> anyhow::Result<ExitCode> {
    match command {
        AuditCommand::Verify {
            bundle: Some(bundle),
            head,
            from,
        } => match audit_verify_bundle(&bundle, Anchors { head, from })? {
            Ok(report) => {
                println!("{}", report.summary());
                if !report.proven() {
                    anyhow::bail!("{}: not proven (see above)", bundle.display());
                }
            }
            Err(problem) => anyhow::bail!("{}: {problem}", bundle.display()),
        },
        AuditCommand::Verify { bundle: None, .. } => {
            let verification = audit_verify(config).await?;
            println!("{}", verification.summary());
            if !verification.ok() {
                anyhow::bail!("the audit chain is broken");
            }
        }
        AuditCommand::Head => {
            let verification = audit_verify(config).await?;
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
        } => export(&since, until.as_deref(), tenant, format, &out, config).await?,
        AuditCommand::Psql { args } => {
            return Ok(super::exit_code(audit_psql(config, &args).await?))
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn export(
    since: &str,
    until: Option<&str>,
    tenant: Option<String>,
    format: ExportFormat,
    out: &Path,
    config: &Config,
) -> anyhow::Result<()> {
    let request = ExportRequest {
        since: time_arg("--since", since)?,
        until: match until {
            Some(until) => time_arg("--until", until)?,
            None => Utc::now(),
        },
        tenant,
        format: match format {
            ExportFormat::Jsonl => EventFormat::Jsonl,
            ExportFormat::Ocsf => EventFormat::Ocsf,
        },
    };
    let summary = audit_export(config, &request, out).await?;
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

/// `sandgate audit verify` / `audit head`: walks the hash chain.
pub async fn audit_verify(config: &Config) -> anyhow::Result<Verification> {
    let db = Database::open(config).await?;
    let verified = AuditStore::new(db.pool.clone()).verify_chain().await;
    db.close().await;
    verified.context("reading the audit chain")
}

/// `--since` / `--until`: an RFC 3339 time, or a span before now (7d, 24h, 30m, 90s).
pub fn time_arg(flag: &str, text: &str) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    let span = replay::parse_duration(text).map_err(|err| {
        anyhow::anyhow!("{flag} {text}: neither an RFC 3339 time nor a span (7d, 24h): {err}")
    })?;
    let span = chrono::Duration::from_std(span).with_context(|| format!("{flag} is too long"))?;
    Utc::now()
        .checked_sub_signed(span)
        .with_context(|| format!("{flag} is too long"))
}

/// `sandgate audit export`: writes the bundle to `out` through a temporary file beside it, so
/// a failed export never leaves a partial bundle under that name.
pub async fn audit_export(
    config: &Config,
    request: &ExportRequest,
    out: &Path,
) -> anyhow::Result<ExportSummary> {
    let dir = match out.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let temp = tempfile_in(dir)?;
    let db = Database::open(config).await?;
    let written = AuditStore::new(db.pool.clone())
        .export_bundle(request, std::io::BufWriter::new(temp.as_file()))
        .await;
    db.close().await;
    let summary = written.context("exporting the audit trail")?;
    temp.as_file().sync_all().context("flushing the bundle")?;
    temp.persist(out)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(summary)
}

fn tempfile_in(dir: &Path) -> anyhow::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(".sandgate-export-")
        .tempfile_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))
}

/// `sandgate audit verify --bundle FILE [--head SEQ:HASH] [--from SEQ:HASH]`: checks a bundle
/// offline. The outer error is about reading the file; the inner one says what in the bundle is
/// wrong.
pub fn audit_verify_bundle(
    path: &Path,
    anchors: Anchors,
) -> anyhow::Result<Result<BundleReport, BundleError>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    match check::verify_bundle(std::io::BufReader::new(file), anchors) {
        Err(BundleError::Read(err)) => {
            Err(err).with_context(|| format!("reading {}", path.display()))
        }
        result => Ok(result),
    }
}

/// `sandgate audit psql [-- ARGS]`: psql as the read-only `sandgate_auditor`, on the embedded
/// cluster's socket (started for the session if no gateway runs) or on `database_url` with
/// `role=sandgate_auditor`. Returns psql's exit code.
pub async fn audit_psql(config: &Config, args: &[String]) -> anyhow::Result<i32> {
    let db = Database::open(config).await?;
    let mut command = match (db.embedded(), &config.database_url) {
        (Some(pg), _) => {
            let mut command = tokio::process::Command::new(pg.program("psql"));
            command
                .arg("--host")
                .arg(pg.socket_dir())
                .arg("--port")
                .arg(pg.port().to_string())
                .args(["--username", "sandgate_auditor", "--dbname", "sandgate"]);
            command
        }
        (None, Some(url)) => {
            let mut command = tokio::process::Command::new("psql");
            command
                .arg(url)
                .env("PGOPTIONS", "-c role=sandgate_auditor");
            command
        }
        (None, None) => anyhow::bail!("no database: neither embedded nor database_url"),
    };
    command.env("PGAPPNAME", "sandgate-audit-psql").args(args);
    let status = command
        .status()
        .await
        .context("running psql (install the postgresql-client package)");
    db.close().await;
    Ok(status?.code().unwrap_or(1))
}
