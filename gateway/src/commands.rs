//! The subcommands other than `serve`, as library functions so tests reach them. Each returns
//! what `main` prints; errors carry their context.

use std::path::Path;

use anyhow::Context;
use chrono::{DateTime, Utc};

use policy_engine::matrix::{self, MatrixCheck};
use policy_engine::{cases, PolicyEngine};

use crate::app::keys::{check_new_key, CheckedKey};
use crate::app::replay::{self, ReplayReport};
use crate::audit::bundle::check::{self, Anchor, BundleError, BundleReport};
use crate::audit::bundle::{ExportRequest, ExportSummary};
use crate::audit::keys::{KeyRow, Revoked};
use crate::audit::verify::Verification;
use crate::audit::{AuditStore, NewKey};
use crate::config::Config;
use crate::database::Database;

/// `sandgate keys create`: a new key in the configured database.
pub async fn create_key(config: &Config, role: &str, tenant: &str) -> anyhow::Result<NewKey> {
    create_key_for(config, role, tenant, None).await
}

/// `sandgate keys create --principal NAME`: a new key of a named principal (default: the key's
/// own id). Keys of one principal are one party for self-approval.
pub async fn create_key_for(
    config: &Config,
    role: &str,
    tenant: &str,
    principal: Option<&str>,
) -> anyhow::Result<NewKey> {
    let checked = check_new_key(role, tenant, principal, None).map_err(anyhow::Error::msg)?;
    create_checked_key(config, &checked).await
}

/// `sandgate keys create [--principal NAME] [--expires-in D]`: stores a checked key.
pub async fn create_checked_key(config: &Config, checked: &CheckedKey) -> anyhow::Result<NewKey> {
    let db = Database::open(config).await?;
    let key = AuditStore::new(db.pool.clone())
        .create_key_by(&checked.spec(), None)
        .await;
    db.close().await;
    key.context("storing the key")
}

/// What to warn about a new key's tenant: absent from the configured policy bundle's data, or
/// the bundle cannot be read to tell. `None`: the policy knows the tenant.
pub fn tenant_warning(config: &Config, tenant: &str) -> Option<String> {
    match PolicyEngine::load(&config.policy_dir) {
        Ok(engine) if engine.tenants().iter().any(|t| t == tenant) => None,
        Ok(_) => Some(crate::app::keys::unknown_tenant_warning(tenant)),
        Err(err) => Some(format!(
            "could not check tenant {tenant} against the policy in {}: {err}",
            config.policy_dir.display()
        )),
    }
}

/// `sandgate keys list [--tenant T]`: every key (never a hash), newest first.
pub async fn list_keys(config: &Config, tenant: Option<&str>) -> anyhow::Result<Vec<KeyRow>> {
    let db = Database::open(config).await?;
    let store = AuditStore::new(db.pool.clone());
    let mut keys = Vec::new();
    let mut before: Option<String> = None;
    let listed = loop {
        let page = match store.list_keys(tenant, before.as_deref(), 500).await {
            Ok(page) => page,
            Err(err) => break Err(err),
        };
        let full = page.len() == 500;
        before = page.last().map(|row| row.id.clone());
        keys.extend(page);
        if !full {
            break Ok(keys);
        }
    };
    db.close().await;
    listed.context("listing keys")
}

/// `sandgate keys revoke ID`.
pub async fn revoke_key(config: &Config, id: &str) -> anyhow::Result<Revoked> {
    let db = Database::open(config).await?;
    let revoked = AuditStore::new(db.pool.clone()).revoke_key(id, None).await;
    db.close().await;
    revoked.context("revoking the key")
}

/// `sandgate keys rotate ID [--expires-in D]`: a new key of the same role, tenant and principal;
/// the old one is revoked in the same transaction. Fails when no live key has that id.
pub async fn rotate_key(
    config: &Config,
    id: &str,
    expires_in: Option<&str>,
) -> anyhow::Result<NewKey> {
    let expires_at = expires_in.map(expiry_from_now).transpose()?;
    let db = Database::open(config).await?;
    let rotated = AuditStore::new(db.pool.clone())
        .rotate_key(id, expires_at)
        .await;
    db.close().await;
    rotated
        .context("rotating the key")?
        .with_context(|| format!("no live key {id} (unknown, revoked or expired)"))
}

/// `--expires-in 30d`: that long from now.
pub fn expiry_from_now(text: &str) -> anyhow::Result<DateTime<Utc>> {
    let span = replay::parse_duration(text).map_err(anyhow::Error::msg)?;
    let span = chrono::Duration::from_std(span).context("--expires-in is too long")?;
    Utc::now()
        .checked_add_signed(span)
        .context("--expires-in is too long")
}

/// What `sandgate policy test` found.
#[derive(Debug)]
pub struct PolicyTestOutcome {
    pub report: cases::CaseReport,
    pub coverage: f64,
    /// The golden decision matrix (`tests/decisions.out`) against the bundle's decisions.
    pub matrix: MatrixCheck,
}

impl PolicyTestOutcome {
    pub fn ok(&self, min_coverage: f64) -> bool {
        self.report.failed() == 0
            && self.coverage >= min_coverage
            && !matches!(self.matrix, MatrixCheck::Differs(_))
    }

    /// What the matrix check found, as `sandgate policy test` prints it.
    pub fn matrix_summary(&self, dir: &Path) -> String {
        let path = dir.join(matrix::MATRIX_FILE);
        match &self.matrix {
            MatrixCheck::Matches => format!("decision matrix {}: matches\n", path.display()),
            MatrixCheck::Absent => {
                format!("decision matrix {}: none (not checked)\n", path.display())
            }
            MatrixCheck::Blessed => {
                format!("decision matrix {}: rewritten (--bless)\n", path.display())
            }
            MatrixCheck::Differs(changes) => format!(
                "FAIL decision matrix {}: the bundle decides differently:\n{changes}\
                 If the change is intended, rewrite it with `sandgate policy test {} --bless` \
                 and commit it with the policy change.\n",
                path.display(),
                dir.display()
            ),
        }
    }
}

/// `sandgate policy test [DIR] [--bless]`: the bundle's YAML cases, with line coverage, and
/// its golden decision matrix (rewritten instead of checked when `bless`).
pub fn policy_test(dir: &Path, bless: bool) -> anyhow::Result<PolicyTestOutcome> {
    let engine = load(dir)?;
    let report = cases::run_cases(&engine, &dir.join("tests"))
        .with_context(|| format!("running the cases in {}", dir.join("tests").display()))?;
    let coverage = report.coverage_percent();
    let matrix = matrix::check(&engine, dir, bless)
        .with_context(|| format!("checking {}", dir.join(matrix::MATRIX_FILE).display()))?;
    Ok(PolicyTestOutcome {
        report,
        coverage,
        matrix,
    })
}

/// `sandgate policy replay`: re-decides the execution decisions of the last `since` with the
/// bundle in `candidate_dir`. Returns the candidate's revision and the report.
pub async fn policy_replay(
    config: &Config,
    candidate_dir: &Path,
    since: &str,
) -> anyhow::Result<(String, ReplayReport)> {
    let window = replay::parse_duration(since).map_err(anyhow::Error::msg)?;
    let candidate = load(candidate_dir)?;
    let since = crate::ids::now_micros()
        - chrono::Duration::from_std(window).context("--since is too long")?;
    let db = Database::open(config).await?;
    let stored = AuditStore::new(db.pool.clone())
        .execution_decisions_since(since)
        .await;
    db.close().await;
    let stored = stored.context("reading past decisions")?;
    let report = tokio::task::spawn_blocking(move || {
        let report = replay::replay(&candidate, &stored);
        (candidate.revision().to_owned(), report)
    })
    .await
    .context("replay task")?;
    Ok(report)
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

/// `sandgate audit verify --bundle FILE [--head SEQ:HASH]`: checks a bundle offline. The outer
/// error is about reading the file; the inner one says what in the bundle is wrong.
pub fn audit_verify_bundle(
    path: &Path,
    anchor: Option<Anchor>,
) -> anyhow::Result<Result<BundleReport, BundleError>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    match check::verify_bundle(std::io::BufReader::new(file), anchor) {
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

pub fn load(dir: &Path) -> anyhow::Result<PolicyEngine> {
    PolicyEngine::load(dir)
        .with_context(|| format!("loading the policy bundle in {}", dir.display()))
}
