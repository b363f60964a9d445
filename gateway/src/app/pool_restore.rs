//! Refill by restore: where checkpoints are available (`snapshots.enabled`, and dockerd in
//! experimental mode: docs/snapshots.md), every key the pool serves (Python executions with or
//! without a preload, bash, sessions, so E2B sandboxes too) refills by restoring a checkpoint
//! of a waiting sandbox of that key (its template) into a fresh container instead of booting
//! runsc (and importing `python_preload`) again; a key whose restores are slower than its boot
//! goes back to booting.
//!
//! Per key, the pool boots one waiting sandbox exactly as it would to serve (the same plan:
//! image, limits, mounts, resident runner), checkpoints it once (the template is never served:
//! the checkpoint stops it) into `<snapshots dir>/pool-<instance>/<id>` (0700, files 0600),
//! records the image's sha256 and removes the template's container and directories. Each
//! refill then checks the sha256 (as a session restore does), prepares a NEW sandbox exactly as
//! a boot would (its own id, egress socket directory, output area and plan) and restores the
//! image into it: nothing writable is shared between siblings (each restore is its own copy of
//! the memory, `/workspace` and `/tmp`; the image is copied into each container's own
//! checkpoint directory).
//!
//! What a restored sibling shares with its template and every other sibling, by construction:
//! everything the waiting interpreter held at the checkpoint, and nothing of any execution
//! (the job, its nonce, its files, environment and egress grant arrive at the claim). The
//! runner reseeds Python's `random`, `numpy.random` and `tempfile`'s names from the kernel per
//! job (a fresh one seeds them at start); what cannot be reseeded is documented in
//! docs/configuration.md: the interpreter's string-hash secret and the address-space layout.
//!
//! A failed template or restore, or a restore slower than the template's boot, sends the key
//! back to booting for [`RETRY_AFTER`] (a dockerd that is not experimental: for the process's
//! life); a start never fails because of it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::pool::{PoolKey, WarmPool};
use super::pool_refill::{enlist, prepare, started};
use super::snapshots::{check_image, image_digest, remove_image};
use super::{error_chain, App};
use crate::runtime::Waits;

/// How long a key whose template or restore failed boots before it tries again.
pub const RETRY_AFTER: Duration = Duration::from_secs(300);
/// Why a key whose restores are slower than its boot boots.
const SLOWER: &str = "restoring is slower than booting here";
/// dockerd's answer to a checkpoint when it is not in experimental mode.
const NOT_EXPERIMENTAL: &str = "only supported in experimental mode";

/// A key's checkpointed, preloaded waiting sandbox.
#[derive(Debug, Clone)]
pub(super) struct Template {
    image: PathBuf,
    sha256: String,
    bytes: u64,
    /// How long booting the template took until it was ready: what a restore must beat.
    boot: Duration,
}

/// Restores in a row slower than the template's boot after which the key boots: one slow
/// restore on a loaded machine is noise, three are the machine.
const SLOWER_IN_A_ROW: u32 = 3;

#[derive(Debug)]
enum Slot {
    /// The template, and how many restores in a row were slower than its boot.
    Ready(Template, u32),
    /// Booting until `until` (`None`: for good), because of `cause`.
    Off {
        until: Option<Instant>,
        cause: String,
    },
}

/// How a key refills, for `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refill {
    /// Booted (restore is off, or the key is not one that restores).
    Boot,
    /// Restored from a template of this many bytes (`None`: not made yet).
    Restore { template_bytes: Option<u64> },
    /// Booted for now: making or restoring its template failed.
    BootAfterFailure { cause: String },
}

/// The pool's templates, and where their images live (`None`: every sandbox is booted).
#[derive(Debug)]
pub struct Restore {
    dir: Option<PathBuf>,
    /// `snapshots.restore_even_if_slower`: keep restoring a key whose restores are slower
    /// than its boot (else three in a row send it back to booting).
    keep_when_slower: bool,
    templates: Mutex<BTreeMap<PoolKey, Slot>>,
}

impl Refill {
    /// For `/readyz`.
    pub fn describe(&self) -> serde_json::Value {
        match self {
            Refill::Boot => serde_json::json!({"by": "boot"}),
            Refill::Restore { template_bytes } => {
                serde_json::json!({"by": "restore", "template_bytes": template_bytes})
            }
            Refill::BootAfterFailure { cause } => {
                serde_json::json!({"by": "boot", "restore_failed": cause})
            }
        }
    }
}

impl Restore {
    pub fn new(dir: Option<PathBuf>, keep_when_slower: bool) -> Restore {
        Restore {
            dir,
            keep_when_slower,
            templates: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<PoolKey, Slot>> {
        self.templates
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How `key` refills now, given what waits in it (`waits`).
    pub(super) fn refill_of(&self, key: &PoolKey, waits: &Waits) -> Refill {
        if self.dir.is_none() || !restores(waits) {
            return Refill::Boot;
        }
        match self.lock().get(key) {
            None => Refill::Restore {
                template_bytes: None,
            },
            Some(Slot::Ready(template, _)) => Refill::Restore {
                template_bytes: Some(template.bytes),
            },
            Some(Slot::Off { cause, .. }) => Refill::BootAfterFailure {
                cause: cause.clone(),
            },
        }
    }

    /// Whether `key` has a template ready: its next start is a restore (which may run beside
    /// other restores, `pool_refill::RESTORES_AT_ONCE`).
    pub(super) fn ready(&self, key: &PoolKey) -> bool {
        matches!(self.lock().get(key), Some(Slot::Ready(..)))
    }

    /// Drops the key's template (its image removed) and boots it for a while.
    pub(super) fn failed(&self, key: &PoolKey, cause: &str) {
        let for_good = cause.contains(NOT_EXPERIMENTAL);
        let until = (!for_good).then(|| Instant::now() + RETRY_AFTER);
        let previous = self.lock().insert(
            key.clone(),
            Slot::Off {
                until,
                cause: cause.to_owned(),
            },
        );
        if let Some(Slot::Ready(template, _)) = &previous {
            remove_image(&template.image);
        }
        let repeated = matches!(&previous, Some(Slot::Off { cause: last, .. }) if last == cause);
        if !repeated {
            tracing::warn!(language = %key.language, memory_mb = key.memory_mb, error = %cause, for_good, "warm pool: this key's sandboxes are booted, not restored");
        }
    }

    /// Counts a restore of `key` slower (or not) than its template's boot; `true` once
    /// [`SLOWER_IN_A_ROW`] were in a row.
    fn timed(&self, key: &PoolKey, slower: bool) -> bool {
        match self.lock().get_mut(key) {
            Some(Slot::Ready(_, in_a_row)) => {
                *in_a_row = if slower { *in_a_row + 1 } else { 0 };
                *in_a_row >= SLOWER_IN_A_ROW && !self.keep_when_slower
            }
            _ => false,
        }
    }

    /// Removes the templates of keys no longer wanted.
    pub(super) fn retain(&self, wanted: impl Fn(&PoolKey) -> bool) {
        self.lock().retain(|key, slot| {
            let keep = wanted(key);
            if let (false, Slot::Ready(template, _)) = (keep, &*slot) {
                remove_image(&template.image);
            }
            keep
        });
    }

    /// Removes every template's image (at shutdown).
    pub fn clear(&self) {
        self.retain(|_| false);
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Whether a key whose sandboxes wait with `waits` refills by restore: every waiting shape
/// the pool serves (a Python interpreter with or without a preload, a plain init for bash, a
/// session's init before its opening line). What waits holds no secret of its own yet: the
/// job's nonce and a session's report key arrive or are made after the claim, and Python's
/// generators are reseeded per job. Whether a restore is faster than a boot is measured per
/// key: three slower in a row send it back to booting ([`SLOWER_IN_A_ROW`]).
fn restores(waits: &Waits) -> bool {
    matches!(waits, Waits::Pool(_) | Waits::Session(_))
}

/// The key's template, made now if it has none: `None` when the key boots.
pub(super) async fn template_for(
    app: &Arc<App>,
    pool: &Arc<WarmPool>,
    key: &PoolKey,
) -> Option<Template> {
    let dir = pool.restore.dir.clone()?;
    if !restores(&pool.waits(key)) {
        return None;
    }
    {
        let wanted: Vec<PoolKey> = pool.lock().targets.keys().cloned().collect();
        pool.restore.retain(|k| wanted.contains(k));
    }
    match pool.restore.lock().get(key) {
        Some(Slot::Ready(template, _)) => return Some(template.clone()),
        Some(Slot::Off { until, .. }) if until.is_none_or(|at| Instant::now() < at) => return None,
        _ => {}
    }
    match make_template(app, pool, key, &dir).await {
        Ok(template) => {
            let slot = Slot::Ready(template.clone(), 0);
            if let Some(Slot::Ready(old, _)) = pool.restore.lock().insert(key.clone(), slot) {
                remove_image(&old.image);
            }
            Some(template)
        }
        Err(cause) => {
            pool.restore.failed(key, &cause);
            None
        }
    }
}

/// Boots one waiting sandbox of `key`, checkpoints it into `dir` and removes it.
async fn make_template(
    app: &Arc<App>,
    pool: &Arc<WarmPool>,
    key: &PoolKey,
    dir: &std::path::Path,
) -> Result<Template, String> {
    private_dir(dir).map_err(|err| format!("preparing {}: {err}", dir.display()))?;
    let begun = Instant::now();
    let (home, plan) = prepare(app, pool, key)?;
    let (mut sandbox, home) = started(pool, home, app.runtime.start(plan).await)?;
    let boot = begun.elapsed();
    let image = dir.join(&home.id);
    let checkpointed = sandbox.checkpoint(&image).await;
    sandbox.discard().await;
    let id = home.id.clone();
    home.remove();
    pool.lock().members.remove(&id);
    if let Err(err) = checkpointed {
        remove_image(&image);
        return Err(format!("checkpointing the template: {}", error_chain(&err)));
    }
    let (sha256, bytes) = image_digest(&image).map_err(|err| {
        remove_image(&image);
        err.to_string()
    })?;
    tracing::info!(language = %key.language, memory_mb = key.memory_mb, bytes, boot_ms = boot.as_millis() as u64, took_ms = begun.elapsed().as_millis() as u64, "warm pool: template checkpointed; this key refills by restore");
    Ok(Template {
        image,
        sha256,
        bytes,
        boot,
    })
}

/// Restores the template into a new sandbox of `key` and leaves it waiting: refused if the
/// image's bytes are not the ones checkpointed. Restores slower than the template's boot send
/// the key back to booting (for [`RETRY_AFTER`]): restoring is only ever chosen for being
/// faster, and on the ptrace platform it need not be (docs/performance.md). "Slower" compares
/// rates: `at_once` restores ran side by side (boots run alone), so this one is slower when it
/// took longer than `at_once` boots.
pub(super) async fn restore_one(
    app: &Arc<App>,
    pool: &Arc<WarmPool>,
    key: &PoolKey,
    template: &Template,
    at_once: usize,
) -> Result<(), String> {
    let begun = Instant::now();
    checked_image(template).await?;
    let checked = begun.elapsed();
    let (home, plan) = prepare(app, pool, key)?;
    let restored = app.runtime.restore(plan, &template.image).await;
    let (sandbox, home) = started(pool, home, restored)?;
    enlist(app, pool, key.clone(), sandbox, home);
    let took = begun.elapsed();
    // Where a refill's time goes (docs/performance.md); the runtime logs create/copy/start.
    tracing::debug!(language = %key.language, serves = ?key.serves, memory_mb = key.memory_mb, at_once, check_ms = checked.as_millis() as u64, took_ms = took.as_millis() as u64, "warm pool: sandbox restored");
    let rivals = u32::try_from(at_once.max(1)).unwrap_or(u32::MAX);
    if pool
        .restore
        .timed(key, took > template.boot.saturating_mul(rivals))
    {
        let cause = format!(
            "{SLOWER}: {SLOWER_IN_A_ROW} restores in a row took longer than the template's boot ({} ms) times the restores at once; the last {} ms, {at_once} at once",
            template.boot.as_millis(),
            took.as_millis(),
        );
        pool.restore.failed(key, &cause);
    }
    Ok(())
}

/// The sha256 check of the template's image, off the async workers (it reads every byte).
async fn checked_image(template: &Template) -> Result<(), String> {
    let (image, sha256) = (template.image.clone(), template.sha256.clone());
    tokio::task::spawn_blocking(move || check_image(&image, &sha256))
        .await
        .map_err(|err| format!("checking the template's image: {err}"))?
        .map_err(|err| format!("the template's image: {err}"))
}

/// Where this gateway's templates live: `<snapshots dir>/pool-<instance>`.
pub fn templates_dir(config: &crate::config::Config, instance: &str) -> Option<PathBuf> {
    let snapshots = &config.snapshots;
    if !snapshots.enabled {
        return None;
    }
    let root = snapshots
        .dir
        .clone()
        .unwrap_or_else(|| config.data_dir.join("snapshots"));
    let dir = root.join(format!("pool-{instance}"));
    Some(std::path::absolute(&dir).unwrap_or(dir))
}

/// Removes what a previous run of this instance left in its templates directory (a crash
/// skips the removal at stop): templates are made again from a boot, never reused.
pub fn sweep(dir: &std::path::Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => tracing::info!(dir = %dir.display(), "templates left by a previous run removed"),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => {
            tracing::warn!(dir = %dir.display(), error = %err, "templates left by a previous run not removed")
        }
    }
}

/// A directory only the gateway's user may enter.
fn private_dir(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::PoolRunner;

    #[test]
    fn every_waiting_shape_restores_and_a_cold_init_does_not() {
        let python = Waits::Pool(PoolRunner::Python {
            preload: vec!["pandas".into()],
        });
        assert!(restores(&python));
        assert!(restores(&Waits::Pool(PoolRunner::Python {
            preload: Vec::new()
        })));
        assert!(restores(&Waits::Pool(PoolRunner::Plain)));
        assert!(restores(&Waits::Session(
            crate::runtime::SessionRunner::Bash
        )));
        assert!(!restores(&Waits::Init));
    }

    #[test]
    fn a_failure_boots_the_key_and_removes_its_template() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("sb_1");
        std::fs::create_dir(&image).unwrap();
        let restore = Restore::new(Some(dir.path().to_owned()), false);
        let key = PoolKey {
            language: "python".into(),
            serves: super::super::pool::Serves::Execution,
            image: "sandgate/python".into(),
            runtime: "runsc".into(),
            memory_mb: 256,
            nano_cpus: 500_000_000,
            pids: 64,
            disk_mb: 64,
            mounts: Vec::new(),
        };
        let waits = Waits::Pool(PoolRunner::Python {
            preload: vec!["json".into()],
        });
        restore.lock().insert(
            key.clone(),
            Slot::Ready(
                Template {
                    image: image.clone(),
                    sha256: String::new(),
                    bytes: 7,
                    boot: Duration::from_secs(1),
                },
                0,
            ),
        );
        assert_eq!(
            restore.refill_of(&key, &waits),
            Refill::Restore {
                template_bytes: Some(7)
            }
        );
        // Two slow restores, a fast one, then three slow: only the third in a row counts.
        for slower in [true, true, false, true, true] {
            assert!(!restore.timed(&key, slower));
        }
        assert!(restore.timed(&key, true));
        restore.failed(
            &key,
            "dockerd answered 500: checkpoint is only supported in experimental mode",
        );
        assert!(!image.exists());
        assert!(matches!(
            restore.lock().get(&key),
            Some(Slot::Off { until: None, .. })
        ));
        assert!(matches!(
            restore.refill_of(&key, &waits),
            Refill::BootAfterFailure { .. }
        ));
        assert_eq!(
            Restore::new(None, false).refill_of(&key, &waits),
            Refill::Boot
        );
    }
}
