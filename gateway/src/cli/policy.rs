//! `sandgate policy test|eval|replay` on a bundle directory, and `policy reload|rollback`
//! asking a running gateway (admin key). `policy_test` and `policy_replay` are public so
//! tests run them the way CI does.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Subcommand, ValueEnum};

use policy_engine::matrix::{self, MatrixCheck};
use policy_engine::{cases, PolicyEngine};

use crate::app::replay::{self, FailOn, ReplayReport};
use crate::audit::AuditStore;
use crate::config::Config;
use crate::database::Database;

#[derive(Subcommand)]
pub enum PolicyCommand {
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
        /// Reload only while this revision is active here and was the last activated on any
        /// replica (`If-Match`, quoted for you; `*`: any loaded revision); else refused, 409.
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
        fail_on: Vec<FailOn>,
        /// text (a summary and the first changed cases) or json (the whole report).
        #[arg(long, value_enum, default_value = "text")]
        format: ReportFormat,
    },
}

/// How an admin subcommand reaches the gateway.
#[derive(clap::Args)]
pub struct GatewayArgs {
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

#[derive(Clone, Copy, ValueEnum)]
pub enum ReportFormat {
    Text,
    Json,
}

pub async fn run(command: PolicyCommand, config: &Config) -> anyhow::Result<ExitCode> {
    let dir_or_configured = |dir: Option<PathBuf>| dir.unwrap_or_else(|| config.policy_dir.clone());
    match command {
        PolicyCommand::Test {
            dir,
            min_coverage,
            bless,
        } => test(&dir_or_configured(dir), min_coverage, bless)?,
        PolicyCommand::Eval {
            input,
            policy_dir,
            entry_point,
            fail_on_deny,
        } => eval(
            &input,
            &dir_or_configured(policy_dir),
            &entry_point,
            fail_on_deny,
        )?,
        PolicyCommand::Reload {
            dir,
            upload,
            if_match,
            gateway,
        } => reload(dir, upload, if_match, gateway, config).await?,
        PolicyCommand::Rollback { revision, gateway } => {
            let body = match revision {
                Some(revision) => serde_json::json!({ "revision": revision }),
                None => serde_json::json!({}),
            };
            let body = AdminBody::Json(body, None);
            admin_post(gateway, config, "/v1/policy/rollback", body).await?;
        }
        PolicyCommand::Replay {
            since,
            policy_dir,
            first,
            fail_on,
            format,
        } => {
            let dir = dir_or_configured(policy_dir);
            let (revision, report) = policy_replay(config, &dir, &since).await?;
            print_replay(&revision, &report, first, format)?;
            let failures = report.failures(&fail_on);
            if failures > 0 {
                anyhow::bail!("{failures} changed decisions match --fail-on");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `sandgate policy reload`: the candidate as a path the gateway reads, or uploaded.
async fn reload(
    dir: Option<PathBuf>,
    upload: Option<PathBuf>,
    if_match: Option<String>,
    gateway: GatewayArgs,
    config: &Config,
) -> anyhow::Result<()> {
    // An entity tag as RFC 9110 writes it: a bare revision is quoted (`*`, a quoted or weak
    // tag, or a list, is sent as given).
    let if_match = if_match.map(|tag| {
        if tag == "*" || tag.contains('"') {
            tag
        } else {
            format!("\"{tag}\"")
        }
    });
    let body = match (upload, dir) {
        (Some(upload), _) => {
            let bytes = crate::app::policy_upload::pack(&upload)
                .with_context(|| format!("packing {}", upload.display()))?;
            AdminBody::Bytes("application/gzip", bytes)
        }
        (None, Some(dir)) => {
            let dir =
                std::path::absolute(&dir).with_context(|| format!("--dir {}", dir.display()))?;
            AdminBody::Json(serde_json::json!({ "dir": dir }), if_match)
        }
        (None, None) => AdminBody::Json(serde_json::json!({}), if_match),
    };
    admin_post(gateway, config, "/v1/policy/reload", body).await
}

/// `sandgate policy test`: prints the report; fails below the bar.
fn test(dir: &Path, min_coverage: f64, bless: bool) -> anyhow::Result<()> {
    let outcome = policy_test(dir, bless)?;
    print!("{}", outcome.report.render());
    print!("{}", outcome.matrix_summary(dir));
    if !outcome.ok(min_coverage) {
        anyhow::bail!(
            "{} cases failed, decision matrix {}, line coverage {:.1}% (minimum {min_coverage}%)",
            outcome.report.failed(),
            match outcome.matrix {
                MatrixCheck::Differs(_) => "differs",
                _ => "ok",
            },
            outcome.coverage
        );
    }
    Ok(())
}

/// `sandgate policy eval`: one decision, printed as JSON.
fn eval(input: &Path, dir: &Path, entry_point: &str, fail_on_deny: bool) -> anyhow::Result<()> {
    let engine = load(dir)?;
    let text =
        std::fs::read_to_string(input).with_context(|| format!("reading {}", input.display()))?;
    let value: serde_json::Value =
        serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {}", input.display()))?;
    let decision = match entry_point {
        "execution" => serde_json::to_value(engine.decide_json(&value))?,
        "egress" => {
            let egress: policy_engine::EgressInput = serde_json::from_value(value)
                .with_context(|| format!("{} is not an egress input", input.display()))?;
            serde_json::to_value(engine.decide_egress(&egress))?
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
    Ok(())
}

fn print_replay(
    revision: &str,
    report: &ReplayReport,
    first: usize,
    format: ReportFormat,
) -> anyhow::Result<()> {
    match format {
        ReportFormat::Text => print!("{}", report.render(revision, first)),
        ReportFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "candidate": revision,
                "report": report,
            }))?
        ),
    }
    Ok(())
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
    let url = super::gateway_url(gateway.url, config);
    let tls = crate::client::TlsFiles {
        ca_file: gateway.ca_file,
        client_cert: None,
    };
    let remote = crate::mcp::remote::Remote::new(&url, &key, &tls)?;
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
    let refused = crate::client::sessions::api_error(status, &answer);
    if let crate::client::sessions::CallError::Api { reasons, .. } = &refused {
        for reason in reasons {
            eprintln!("{}: {}", reason.code, reason.message);
        }
    }
    Err(refused.into())
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

fn load(dir: &Path) -> anyhow::Result<PolicyEngine> {
    PolicyEngine::load(dir)
        .with_context(|| format!("loading the policy bundle in {}", dir.display()))
}
