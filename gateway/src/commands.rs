//! The subcommands other than `serve`, as library functions so tests reach them. Each returns
//! what `main` prints; errors carry their context.

use std::path::Path;

use anyhow::Context;

use policy_engine::matrix::{self, MatrixCheck};
use policy_engine::{cases, PolicyEngine};

use crate::app::replay::{self, ReplayReport};
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
    crate::app::keys::check_new_key(role, tenant, principal).map_err(anyhow::Error::msg)?;
    let db = Database::open(config).await?;
    let key = AuditStore::new(db.pool.clone())
        .create_key_for(role, tenant, principal)
        .await;
    db.close().await;
    key.context("storing the key")
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

pub fn load(dir: &Path) -> anyhow::Result<PolicyEngine> {
    PolicyEngine::load(dir)
        .with_context(|| format!("loading the policy bundle in {}", dir.display()))
}
