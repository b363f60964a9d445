//! Gateway configuration: a YAML file whose every key is optional, overridden key by key
//! from `SANDGATE_<KEY>` environment variables. Unknown keys are rejected.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("invalid config: {message}")]
    Invalid { message: String },
}

/// The container limits the warm pool starts each language's sandboxes with until a request
/// asks for others (see `app::pool`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WarmPoolLimits {
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: u64,
    pub disk_mb: u64,
}

impl Default for WarmPoolLimits {
    fn default() -> Self {
        WarmPoolLimits {
            memory_mb: 512,
            cpus: 1.0,
            pids: 256,
            disk_mb: 256,
        }
    }
}

/// Hard upper bounds on what any decision may grant. Policy may lower them, never raise them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Ceilings {
    pub timeout_ms: u64,
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: u64,
    pub disk_mb: u64,
    pub output_bytes: u64,
    /// Longest a session may sit idle between executions, in seconds.
    pub session_idle_s: u64,
    /// Longest a session may live, in seconds.
    pub session_ttl_s: u64,
}

impl Default for Ceilings {
    fn default() -> Self {
        Ceilings {
            timeout_ms: 60_000,
            memory_mb: 2048,
            cpus: 2.0,
            pids: 512,
            disk_mb: 1024,
            output_bytes: 10 * 1024 * 1024,
            session_idle_s: 600,
            session_ttl_s: 3600,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// The Docker runtime name registered in dockerd (`runsc`, `runc`).
    pub runtime: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Dataset {
    pub path: PathBuf,
    #[serde(default)]
    pub description: String,
}

/// The API over HTTPS (rustls). With `client_ca_file`, every client must present a
/// certificate that CA signed; one without is refused during the handshake.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    /// PEM: the server's certificate, then any intermediates.
    pub cert_file: PathBuf,
    /// PEM: its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM: the CA(s) whose client certificates are accepted.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: SocketAddr,
    /// Absent: the embedded default (a private PostgreSQL under `data_dir`).
    pub database_url: Option<String>,
    pub data_dir: PathBuf,
    pub policy_dir: PathBuf,
    /// Language -> image.
    pub images: BTreeMap<String, String>,
    /// Backend name (as named by policy) -> Docker runtime.
    pub backends: BTreeMap<String, Backend>,
    pub datasets: BTreeMap<String, Dataset>,
    /// Names the egress proxy resolves to fixed addresses before asking DNS (split-horizon
    /// set-ups, tests). The addresses still go through the proxy's address checks.
    pub egress_hosts: BTreeMap<String, Vec<std::net::IpAddr>>,
    pub ceilings: Ceilings,
    pub max_concurrent: usize,
    /// Open sessions per tenant, those waiting for review included; beyond: 429. Each open one
    /// holds a slot of `max_concurrent` (a waiting one holds none: it has no sandbox).
    pub max_sessions: usize,
    /// Executions that may wait for a slot (all tenants together); beyond: 429.
    pub max_queued: usize,
    /// Executions one tenant may have waiting for a slot (its share of `max_queued`; a larger
    /// value counts as `max_queued`); beyond: 429, while other tenants still queue.
    pub max_queued_per_tenant: usize,
    /// Bounds on requests held for human review (count and stored bytes, per tenant and per key).
    pub pending_approvals: PendingApprovalLimits,
    /// The static `sandbox-init` binary; default: `sandbox-init` next to the `sandgate` executable.
    pub sandbox_init: Option<PathBuf>,
    /// Directory holding `initdb` and `pg_ctl` for the embedded database; default: the newest
    /// `/usr/lib/postgresql/*/bin`.
    pub postgres_bin_dir: Option<PathBuf>,
    /// Seconds an execution sent to human review waits for a reviewer before it is denied
    /// (`approval.expired`).
    pub approval_ttl_s: u64,
    /// Days after which a finished execution's payload (stdout, stderr, output files) is purged;
    /// its record, decision and audit events stay. 0 keeps payloads forever.
    pub retention_days: u32,
    /// Milliseconds a replica's lease on a running execution or session lasts; it renews them
    /// every third of it. Another replica closes the records of one whose leases expired
    /// (see `app::replicas`). Every replica on one database should use the same value.
    pub lease_ms: u64,
    /// Serve the API over HTTPS; absent: plain HTTP (keep it on loopback then).
    pub tls: Option<Tls>,
    /// Sandboxes started ahead per language (`{}`: no pool).
    pub warm_pool: BTreeMap<String, usize>,
    /// Modules the waiting Python interpreter imports (and warms) before its job.
    pub python_preload: Vec<String>,
    /// The configured default shape: `warm_pool` keeps this many of it waiting whatever the
    /// demand (its floor).
    pub warm_pool_limits: WarmPoolLimits,
    /// Seconds of claims the pool sizes itself by: a key claimed within it keeps sandboxes
    /// waiting in proportion to its claims; a key not claimed within it drains.
    pub warm_pool_window_s: u64,
    /// Container memory all waiting sandboxes may hold together, MB (floors are kept even
    /// beyond it).
    pub warm_pool_memory_mb: u64,
    /// Bounds on refusals anyone can cause in bulk (failed authentications, traversal, probes,
    /// a full queue): the aggregation window and the per-source and per-key rates.
    pub refusals: RefusalLimits,
    /// Bounds on building policy proposals (`app::proposals`): builds at once, and agents'
    /// access-requests per key per hour.
    pub proposals: ProposalLimits,
    /// PEM certificates the proxy trusts, besides this machine's roots, when it verifies an
    /// inspected upstream: e.g. an internal CA.
    pub egress_ca_file: Option<PathBuf>,
    /// Credentials the proxy may attach to inspected requests, by name. Only where their values
    /// come from is configured here; the values are read at start-up and never printed.
    pub credentials: BTreeMap<String, CredentialConfig>,
    /// The embedded database also listens on TCP here, for auditors' tools (Grafana, psql):
    /// only the read-only role `sandgate_auditor` may log in over it, with the password in
    /// `password_file`. Absent: Unix socket only. Ignored with `database_url`.
    pub audit_listen: Option<AuditListen>,
    /// Accepted policy bundles kept (under `<data_dir>/policy-revisions/`) for rollback.
    pub policy_keep: usize,
    /// Paused sessions' checkpoint images (DESIGN 15; docs/snapshots.md).
    pub snapshots: SnapshotsConfig,
    /// The E2B-compatible API under `/e2b` (docs/e2b.md).
    pub e2b: E2bConfig,
}

/// `snapshots: {enabled, dir, ttl_s, max_bytes_per_tenant, restore_even_if_slower}`: where paused sessions' checkpoint
/// images live (0700, files 0600), how long they are kept, how many bytes a tenant may hold.
/// Enabling them needs dockerd in experimental mode (its checkpoint API).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SnapshotsConfig {
    pub enabled: bool,
    /// Absent: `<data_dir>/snapshots`.
    pub dir: Option<PathBuf>,
    pub ttl_s: u64,
    pub max_bytes_per_tenant: u64,
    /// The warm pool keeps refilling a key by restore even when its restores are slower than
    /// its boot (default `false`: three slower in a row send the key back to booting).
    pub restore_even_if_slower: bool,
}

impl Default for SnapshotsConfig {
    fn default() -> Self {
        SnapshotsConfig {
            enabled: false,
            dir: None,
            ttl_s: 7 * 24 * 3600,
            max_bytes_per_tenant: 10 * 1024 * 1024 * 1024,
            restore_even_if_slower: false,
        }
    }
}

/// `e2b:`: the E2B-compatible API (`/e2b` on the main listener, DESIGN section 14).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct E2bConfig {
    /// `false`: every `/e2b` path answers 404.
    pub enabled: bool,
    /// E2B template name -> what a sandbox of it is. Unknown templates are refused (404).
    pub templates: BTreeMap<String, E2bTemplate>,
}

/// One E2B template: the session's language, hence its image (`images`) and its runner.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct E2bTemplate {
    /// `bash` or `python` (the session runners).
    pub language: String,
}

impl Default for E2bConfig {
    fn default() -> Self {
        let template = |language: &str| E2bTemplate {
            language: language.to_owned(),
        };
        E2bConfig {
            enabled: true,
            templates: BTreeMap::from([
                ("base".to_owned(), template("bash")),
                ("code-interpreter-v1".to_owned(), template("python")),
            ]),
        }
    }
}

/// `refusals:`: bounds on the refusals anyone can cause in bulk (`app::refusals` enforces them).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RefusalLimits {
    /// Length of one aggregation and rate window, in seconds.
    pub window_s: u64,
    /// Refusals one source address may cause per window before it gets 429.
    pub per_source: u32,
    /// Refusals one key id (claimed, for failed authentications; the caller's otherwise) may
    /// cause per window before 429.
    pub per_key: u32,
}

impl Default for RefusalLimits {
    fn default() -> Self {
        RefusalLimits {
            window_s: 60,
            per_source: 20,
            per_key: 20,
        }
    }
}

/// `proposals: {concurrent_builds, access_requests_per_hour}`. Building a proposal copies the
/// bundle, runs its tests and replays up to 20,000 decisions twice: at most `concurrent_builds`
/// run at once on a replica (another is refused with 429, not queued), and an agent key may open
/// at most `access_requests_per_hour` proposals by access-request in any hour.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ProposalLimits {
    pub concurrent_builds: u32,
    pub access_requests_per_hour: u32,
}

impl Default for ProposalLimits {
    fn default() -> Self {
        ProposalLimits {
            concurrent_builds: 2,
            access_requests_per_hour: 10,
        }
    }
}

/// `audit_listen: {address: 127.0.0.1:5433, password_file: /etc/sandgate/auditor.password}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuditListen {
    /// The address and port PostgreSQL listens on (its one port: the Unix socket is then named
    /// after it too).
    pub address: SocketAddr,
    /// The `sandgate_auditor` password (one line; a trailing newline is dropped).
    pub password_file: PathBuf,
}

/// Where one credential's value comes from and how it is sent: exactly one of `value_env` (an
/// environment variable of the gateway) and `value_file` (a file; one trailing newline is
/// dropped), in the header `header`, as `format` with `{value}` replaced (`Bearer {value}`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    #[serde(default)]
    pub value_env: Option<String>,
    #[serde(default)]
    pub value_file: Option<PathBuf>,
    pub header: String,
    #[serde(default = "default_credential_format")]
    pub format: String,
}

fn default_credential_format() -> String {
    "{value}".to_owned()
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            database_url: None,
            data_dir: PathBuf::from(".sandgate"),
            policy_dir: PathBuf::from("policies"),
            images: BTreeMap::from([
                ("python".to_owned(), "sandgate/python".to_owned()),
                // A coding agent's shell needs the same toolbox as its Python (python3, pip,
                // pytest, git, curl): bash runs in the python image (README "Sandbox images").
                ("bash".to_owned(), "sandgate/python".to_owned()),
            ]),
            backends: BTreeMap::from([(
                "gvisor".to_owned(),
                Backend {
                    runtime: "runsc".to_owned(),
                },
            )]),
            datasets: BTreeMap::new(),
            egress_hosts: BTreeMap::new(),
            ceilings: Ceilings::default(),
            max_concurrent: 8,
            max_sessions: 4,
            max_queued: 64,
            max_queued_per_tenant: 16,
            pending_approvals: PendingApprovalLimits::default(),
            sandbox_init: None,
            postgres_bin_dir: None,
            approval_ttl_s: 3600,
            retention_days: 30,
            lease_ms: 30_000,
            tls: None,
            warm_pool: BTreeMap::from([("python".to_owned(), 1), ("bash".to_owned(), 1)]),
            python_preload: ["numpy", "pandas", "matplotlib"]
                .map(str::to_owned)
                .to_vec(),
            warm_pool_limits: WarmPoolLimits::default(),
            warm_pool_window_s: 600,
            warm_pool_memory_mb: 2048,
            refusals: RefusalLimits::default(),
            proposals: ProposalLimits::default(),
            egress_ca_file: None,
            credentials: BTreeMap::new(),
            audit_listen: None,
            policy_keep: 10,
            snapshots: SnapshotsConfig::default(),
            e2b: E2bConfig::default(),
        }
    }
}

/// How many requests, and how many stored bytes (code and files), may wait for a reviewer at
/// once; beyond either bound a request the policy sends to review is refused (429) and recorded
/// as denied (`approval.pending_limit`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PendingApprovalLimits {
    pub per_tenant: u32,
    pub per_key: u32,
    pub bytes_per_tenant: u64,
    pub bytes_per_key: u64,
}

impl Default for PendingApprovalLimits {
    fn default() -> Self {
        PendingApprovalLimits {
            per_tenant: 200,
            per_key: 50,
            bytes_per_tenant: 512 * 1024 * 1024,
            bytes_per_key: 128 * 1024 * 1024,
        }
    }
}

/// Most sandboxes the pool keeps waiting per language (each holds memory while it waits).
const MAX_POOLED: usize = 64;

/// Longest a request may wait for a reviewer: 30 days.
const MAX_APPROVAL_TTL_S: u64 = 30 * 24 * 3600;

/// Keys that can be set from the environment, and whether the value is taken verbatim (text)
/// or parsed as YAML (numbers, maps).
const ENV_KEYS: &[(&str, EnvValue)] = &[
    ("listen", EnvValue::Text),
    ("database_url", EnvValue::Text),
    ("data_dir", EnvValue::Text),
    ("policy_dir", EnvValue::Text),
    ("images", EnvValue::Yaml),
    ("backends", EnvValue::Yaml),
    ("datasets", EnvValue::Yaml),
    ("egress_hosts", EnvValue::Yaml),
    ("ceilings", EnvValue::Yaml),
    ("max_concurrent", EnvValue::Yaml),
    ("max_sessions", EnvValue::Yaml),
    ("max_queued", EnvValue::Yaml),
    ("max_queued_per_tenant", EnvValue::Yaml),
    ("pending_approvals", EnvValue::Yaml),
    ("sandbox_init", EnvValue::Text),
    ("postgres_bin_dir", EnvValue::Text),
    ("approval_ttl_s", EnvValue::Yaml),
    ("retention_days", EnvValue::Yaml),
    ("lease_ms", EnvValue::Yaml),
    ("tls", EnvValue::Yaml),
    ("warm_pool", EnvValue::Yaml),
    ("python_preload", EnvValue::Yaml),
    ("warm_pool_limits", EnvValue::Yaml),
    ("warm_pool_window_s", EnvValue::Yaml),
    ("warm_pool_memory_mb", EnvValue::Yaml),
    ("refusals", EnvValue::Yaml),
    ("proposals", EnvValue::Yaml),
    ("egress_ca_file", EnvValue::Text),
    ("credentials", EnvValue::Yaml),
    ("audit_listen", EnvValue::Yaml),
    ("policy_keep", EnvValue::Yaml),
    ("snapshots", EnvValue::Yaml),
    ("e2b", EnvValue::Yaml),
];

/// `SANDGATE_*` variables read elsewhere than the config: the command line's (`--config`,
/// `exec --url/--key`) and `images/build.sh`'s. Any other `SANDGATE_*` is a warning at start.
const OTHER_ENV_VARS: &[&str] = &[
    "SANDGATE_CONFIG",
    "SANDGATE_URL",
    "SANDGATE_KEY",
    "SANDGATE_IMAGE_MIRROR",
    "SANDGATE_IMAGE_SUITE",
    "SANDGATE_IMAGE_TMPDIR",
    "SANDGATE_IMAGE_EXTRA_CA",
    "SANDGATE_IMAGE_TRUST_HOST_CA",
];

/// The `SANDGATE_*` names among `names` that nothing reads (a typo such as
/// `SANDGATE_MAX_CONCURENT`), sorted.
pub fn unknown_env_vars(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let known = known_env_vars();
    let mut unknown: Vec<String> = names
        .into_iter()
        .filter(|name| name.starts_with("SANDGATE_") && !known.contains(name))
        .collect();
    unknown.sort();
    unknown
}

/// Every variable the gateway reads, for the warning about an unknown one.
pub fn known_env_vars() -> Vec<String> {
    ENV_KEYS
        .iter()
        .map(|(key, _)| env_var(key))
        .chain(OTHER_ENV_VARS.iter().map(|var| (*var).to_owned()))
        .collect()
}

fn env_var(key: &str) -> String {
    format!("SANDGATE_{}", key.to_ascii_uppercase())
}

#[derive(Clone, Copy)]
enum EnvValue {
    Text,
    Yaml,
}

impl Config {
    /// Reads the optional file, then applies `SANDGATE_<KEY>` overrides from `env`.
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let text = match file {
            Some(path) => std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
                path: path.to_owned(),
                err,
            })?,
            None => String::new(),
        };
        Config::from_yaml_and_env(&text, env)
    }

    pub fn from_yaml_and_env(
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid { message };
        let mut doc: serde_yaml_ng::Value = if text.trim().is_empty() {
            serde_yaml_ng::Value::Mapping(Default::default())
        } else {
            serde_yaml_ng::from_str(text).map_err(|err| invalid(err.to_string()))?
        };
        let map = doc
            .as_mapping_mut()
            .ok_or_else(|| invalid("the config file must be a YAML mapping".to_owned()))?;
        let mut from_env = Vec::new();
        for (key, kind) in ENV_KEYS {
            let var = env_var(key);
            let Some(raw) = env(&var) else { continue };
            let value = match kind {
                EnvValue::Text => serde_yaml_ng::Value::String(raw),
                EnvValue::Yaml => serde_yaml_ng::from_str(&raw).map_err(|err| {
                    invalid(format!("{var}: {}", crate::plain::plain(&err.to_string())))
                })?,
            };
            map.insert(serde_yaml_ng::Value::String((*key).to_owned()), value);
            from_env.push(*key);
        }
        let config: Config = serde_path_to_error::deserialize(doc)
            .map_err(|err| invalid(type_error(&err, &from_env)))?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |message: String| Err(ConfigError::Invalid { message });
        if self.max_concurrent == 0 {
            return invalid("max_concurrent must be at least 1".to_owned());
        }
        let pending = &self.pending_approvals;
        if pending.per_key == 0 || pending.per_key > pending.per_tenant {
            return invalid(
                "pending_approvals: per_key must be at least 1 and at most per_tenant".to_owned(),
            );
        }
        if pending.bytes_per_key == 0 || pending.bytes_per_key > pending.bytes_per_tenant {
            return invalid(
                "pending_approvals: bytes_per_key must be at least 1 and at most bytes_per_tenant"
                    .to_owned(),
            );
        }
        if self.approval_ttl_s == 0 || self.approval_ttl_s > MAX_APPROVAL_TTL_S {
            return invalid(format!(
                "approval_ttl_s must be between 1 and {MAX_APPROVAL_TTL_S} (30 days)"
            ));
        }
        if !(300..=600_000).contains(&self.lease_ms) {
            return invalid(
                "lease_ms must be between 300 and 600000 (10 minutes); 30000 is the default"
                    .to_owned(),
            );
        }
        if self.backends.is_empty() {
            return invalid("at least one backend must be configured".to_owned());
        }
        for (name, dataset) in &self.datasets {
            if !dataset.path.is_absolute() {
                return invalid(format!("datasets.{name}.path must be an absolute path"));
            }
        }
        if let Some((language, _)) = self
            .warm_pool
            .iter()
            .find(|(language, count)| **count > 0 && !self.images.contains_key(*language))
        {
            return invalid(format!(
                "warm_pool.{language}: no image is configured for {language} (images.{language})"
            ));
        }
        let w = &self.warm_pool_limits;
        if w.memory_mb < 16 || !(w.cpus.is_finite() && w.cpus > 0.0) || w.disk_mb == 0 {
            return invalid(
                "warm_pool_limits: memory_mb >= 16, a finite cpus > 0 and disk_mb >= 1 are required"
                    .to_owned(),
            );
        }
        if self.warm_pool_window_s == 0 || self.warm_pool_window_s > 86_400 {
            return invalid(
                "warm_pool_window_s must be between 1 and 86400 (a day); 600 is the default"
                    .to_owned(),
            );
        }
        if self.warm_pool.values().any(|count| *count > MAX_POOLED) {
            return invalid(format!(
                "warm_pool: at most {MAX_POOLED} sandboxes per language"
            ));
        }
        for (name, credential) in &self.credentials {
            validate_credential(name, credential)?;
        }
        let c = &self.ceilings;
        if c.timeout_ms == 0
            || c.memory_mb < 16
            || !(c.cpus.is_finite() && c.cpus > 0.0)
            || c.pids < 256
        {
            return invalid(
                "ceilings: timeout_ms > 0, memory_mb >= 16, cpus > 0 and pids >= 256 are required \
                 (gVisor's own threads count against the pids limit)"
                    .to_owned(),
            );
        }
        let p = &self.proposals;
        if p.concurrent_builds == 0 || p.concurrent_builds > 64 || p.access_requests_per_hour == 0 {
            return invalid(
                "proposals: concurrent_builds between 1 and 64 and access_requests_per_hour >= 1"
                    .to_owned(),
            );
        }
        let r = &self.refusals;
        if r.window_s == 0 || r.window_s > 86_400 || r.per_source == 0 || r.per_key == 0 {
            return invalid(
                "refusals: window_s between 1 and 86400, per_source >= 1 and per_key >= 1"
                    .to_owned(),
            );
        }
        validate_e2b(&self.e2b, &self.images)
    }

    /// The `sandbox-init` binary to mount into every sandbox.
    pub fn sandbox_init_path(&self) -> PathBuf {
        if let Some(path) = &self.sandbox_init {
            return path.clone();
        }
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("sandbox-init")))
            .unwrap_or_else(|| PathBuf::from("sandbox-init"))
    }
}

/// A deserialisation error naming where it is: the key path (`ceilings.pids`), and the
/// `SANDGATE_*` variable when the value came from the environment; no Rust type names.
fn type_error(err: &serde_path_to_error::Error<serde_yaml_ng::Error>, from_env: &[&str]) -> String {
    let inner = crate::plain::plain(&err.inner().to_string());
    let path = err.path().to_string();
    if path == "." {
        return inner;
    }
    let top = path.split(['.', '[']).next().unwrap_or_default();
    match from_env.iter().find(|key| **key == top) {
        Some(key) => format!(
            "{} (from the environment, key {path}): {inner}",
            env_var(key)
        ),
        None => format!("{path}: {inner}"),
    }
}

/// A credential's name and settings; its value is only read later, at start-up.
/// Each E2B template names a language with a session runner and a configured image.
fn validate_e2b(e2b: &E2bConfig, images: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    for (name, template) in &e2b.templates {
        let language = &template.language;
        if !matches!(language.as_str(), "bash" | "python") || !images.contains_key(language) {
            return Err(ConfigError::Invalid {
                message: format!(
                    "e2b.templates.{name}.language: {language:?} must be bash or python, with an \
                     image configured for it (images.{language})"
                ),
            });
        }
    }
    Ok(())
}

fn validate_credential(name: &str, credential: &CredentialConfig) -> Result<(), ConfigError> {
    let invalid = |why: &str| {
        Err(ConfigError::Invalid {
            message: format!("credentials.{name}: {why}"),
        })
    };
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !name_ok {
        return invalid("a credential name is 1-64 of a-z, 0-9, `_`, `-`");
    }
    if credential.value_env.is_some() == credential.value_file.is_some() {
        return invalid("set exactly one of value_env and value_file");
    }
    let header_ok = !credential.header.is_empty()
        && credential
            .header
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !header_ok {
        return invalid("header must be a lower-case header name (a-z, 0-9, `-`)");
    }
    if credential.header == "host" || credential.header.starts_with("proxy-") {
        return invalid("header may not be Host or a Proxy-* header");
    }
    if !credential.format.contains("{value}") {
        return invalid("format must contain {value}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn empty_file_gives_defaults() {
        let config = Config::from_yaml_and_env("", no_env).unwrap();
        assert_eq!(config, Config::default());
    }

    #[test]
    fn e2b_templates_need_a_session_language_with_an_image() {
        let yaml = "e2b: {enabled: false, templates: {r: {language: ruby}}}\n";
        let err = Config::from_yaml_and_env(yaml, no_env).unwrap_err();
        assert!(
            err.to_string().contains("e2b.templates.r.language"),
            "{err}"
        );
        let config =
            Config::from_yaml_and_env("e2b: {templates: {mine: {language: bash}}}\n", no_env)
                .unwrap();
        assert!(config.e2b.enabled);
        assert_eq!(config.e2b.templates.len(), 1);
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = Config::from_yaml_and_env("listen: 127.0.0.1:1\nlisen: x\n", no_env).unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
    }

    #[test]
    fn env_overrides_file() {
        let env = |key: &str| match key {
            "SANDGATE_LISTEN" => Some("127.0.0.1:9999".to_owned()),
            "SANDGATE_MAX_CONCURRENT" => Some("3".to_owned()),
            "SANDGATE_DATABASE_URL" => Some("postgres://u@h/db".to_owned()),
            _ => None,
        };
        let config =
            Config::from_yaml_and_env("listen: 127.0.0.1:1\nmax_concurrent: 2\n", env).unwrap();
        assert_eq!(config.listen.port(), 9999);
        assert_eq!(config.max_concurrent, 3);
        assert_eq!(config.database_url.as_deref(), Some("postgres://u@h/db"));
    }

    #[test]
    fn type_errors_name_the_key_or_the_variable_in_plain_words() {
        let err = Config::from_yaml_and_env("max_concurrent: lots\n", no_env).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("max_concurrent: "), "{text}");
        assert!(text.contains("a whole number"), "{text}");
        assert!(!text.contains("usize"), "{text}");

        let env = |key: &str| (key == "SANDGATE_MAX_QUEUED").then(|| "many".to_owned());
        let text = Config::from_yaml_and_env("", env).unwrap_err().to_string();
        assert!(text.contains("SANDGATE_MAX_QUEUED"), "{text}");

        let text = Config::from_yaml_and_env("ceilings: {pids: x}\n", no_env)
            .unwrap_err()
            .to_string();
        assert!(text.contains("ceilings.pids: "), "{text}");
    }

    #[test]
    fn unknown_sandgate_variables_are_found_and_known_ones_are_not() {
        let names = [
            "SANDGATE_MAX_CONCURENT",
            "SANDGATE_MAX_CONCURRENT",
            "SANDGATE_KEY",
            "HOME",
        ]
        .map(str::to_owned);
        assert_eq!(unknown_env_vars(names), ["SANDGATE_MAX_CONCURENT"]);
    }

    #[test]
    fn credentials_name_exactly_one_source_and_a_header() {
        let ok = "credentials:\n  github: {value_env: GH, header: authorization, format: 'Bearer {value}'}\n";
        let config = Config::from_yaml_and_env(ok, no_env).unwrap();
        assert_eq!(
            config.credentials["github"].value_env.as_deref(),
            Some("GH")
        );
        for bad in [
            "credentials: {github: {header: authorization}}\n",
            "credentials: {github: {value_env: A, value_file: /b, header: authorization}}\n",
            "credentials: {github: {value_env: A, header: Authorization}}\n",
            "credentials: {github: {value_env: A, header: authorization, format: x}}\n",
            "credentials: {GitHub: {value_env: A, header: authorization}}\n",
        ] {
            let err = Config::from_yaml_and_env(bad, no_env).unwrap_err();
            assert!(err.to_string().contains("credentials."), "{bad}: {err}");
        }
    }

    #[test]
    fn ceilings_are_validated() {
        let err = Config::from_yaml_and_env("ceilings: {pids: 10}\n", no_env).unwrap_err();
        assert!(err.to_string().contains("pids"), "{err}");
    }
}
