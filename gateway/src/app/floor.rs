//! The floor the gateway enforces whatever the policy says: configured backends, images and
//! datasets only, datasets read-only under `/data/`, limits lowered to the ceilings. An allowed
//! decision becomes a [`Runnable`], or a deny with the gateway's reason.

use serde::{Deserialize, Serialize};

use policy_engine::{Decision, Limits, MountGrant, NetworkGrant, Reason};

use super::App;
use crate::config::Ceilings;
use crate::runtime::ReadOnlyMount;

/// Fewest pids a sandbox gets, whatever the policy says (see `clamp`).
pub const MIN_PIDS: u64 = 256;

/// An allowed decision, made concrete by the gateway: the floor it enforces whatever the policy
/// says (configured backend, configured image, limits under the ceilings). Stored with an
/// approval, it is exactly what a reviewer approves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Runnable {
    pub(super) backend: String,
    pub(super) runtime: String,
    pub(super) image: String,
    pub(super) limits: Limits,
    pub(super) mounts: Vec<ReadOnlyMount>,
    /// The grant the egress proxy serves; `None`: no socket at all.
    pub(super) network: Option<NetworkGrant>,
}

impl App {
    /// Turns an allow into something runnable, or into a deny with the gateway's reason. The
    /// floor holds whatever the policy returned; the recorded decision shows the clamped limits.
    pub(super) fn enforce_floor(
        &self,
        language: &str,
        decision: &mut Decision,
    ) -> Option<Runnable> {
        if !decision.allow {
            return None;
        }
        match self.runnable(language, decision) {
            Ok(runnable) => {
                decision.limits = Some(runnable.limits.clone());
                Some(runnable)
            }
            Err(reason) => {
                decision.allow = false;
                decision.reasons.push(reason);
                None
            }
        }
    }

    fn runnable(&self, language: &str, decision: &Decision) -> Result<Runnable, Reason> {
        let refuse = |code: &str, message: String| {
            Err(Reason {
                code: code.to_owned(),
                message,
            })
        };
        let network = decision
            .network
            .as_ref()
            .filter(|grant| !grant.allow.is_empty())
            .cloned();
        if network.is_some() && self.egress.is_none() {
            return refuse(
                "network.unavailable",
                "the policy grants network access but this gateway's egress proxy is not running"
                    .into(),
            );
        }
        let (Some(backend), Some(limits)) = (&decision.backend, &decision.limits) else {
            return refuse(
                "policy.error",
                "an allow decision must name a backend and set limits".into(),
            );
        };
        let Some(runtime) = self.config.backends.get(backend) else {
            return refuse(
                "backend.unavailable",
                format!("backend {backend:?} is not configured in this gateway"),
            );
        };
        let Some(image) = self.config.images.get(language) else {
            return refuse(
                "language.unavailable",
                format!("no sandbox image is configured for language {language:?}"),
            );
        };
        let mut limits = limits.clone();
        clamp(&mut limits, &self.config.ceilings);
        let mounts = decision
            .mounts
            .iter()
            .map(|grant| self.dataset_mount(grant))
            .collect::<Result<_, _>>()?;
        Ok(Runnable {
            backend: backend.clone(),
            runtime: runtime.runtime.clone(),
            image: image.clone(),
            limits,
            mounts,
            network,
        })
    }

    /// A granted dataset as a read-only mount: the dataset must be configured, the target a
    /// plain absolute path under `/data/`. Writable mounts are never granted.
    fn dataset_mount(&self, grant: &MountGrant) -> Result<ReadOnlyMount, Reason> {
        let refuse = |code: &str, message: String| Reason {
            code: code.to_owned(),
            message,
        };
        let Some(dataset) = self.config.datasets.get(&grant.dataset) else {
            return Err(refuse(
                "mount.unavailable",
                format!(
                    "dataset {:?} is not configured in this gateway",
                    grant.dataset
                ),
            ));
        };
        if !grant.read_only {
            return Err(refuse(
                "mount.read_only",
                format!("dataset {:?} can only be mounted read-only", grant.dataset),
            ));
        }
        let target = &grant.target;
        let plain = target.strip_prefix("/data/").is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .split('/')
                    .all(|part| !part.is_empty() && part != "." && part != "..")
                && !rest.chars().any(char::is_control)
        });
        if !plain {
            return Err(refuse(
                "policy.error",
                format!("mount target {target:?} must be a plain path under /data/"),
            ));
        }
        Ok(ReadOnlyMount {
            source: dataset.path.clone(),
            target: target.clone(),
        })
    }

    /// Whether a decision made runnable earlier (and reviewed since) still fits this gateway's
    /// configuration, which may have changed while it waited (a restart, a lowered ceiling, a
    /// removed backend, image or dataset). What was reviewed is never silently changed: a
    /// mismatch is refused, and the reviewer can reject or the agent ask again.
    pub(super) fn still_runnable(&self, runnable: &Runnable) -> Result<(), String> {
        let runtime_ok = self
            .config
            .backends
            .get(&runnable.backend)
            .is_some_and(|backend| backend.runtime == runnable.runtime);
        if !runtime_ok {
            return Err(format!(
                "backend {:?} (runtime {:?}) is no longer configured",
                runnable.backend, runnable.runtime
            ));
        }
        if !self
            .config
            .images
            .values()
            .any(|image| image == &runnable.image)
        {
            return Err(format!(
                "image {:?} is no longer configured",
                runnable.image
            ));
        }
        let mut limits = runnable.limits.clone();
        clamp(&mut limits, &self.config.ceilings);
        if limits != runnable.limits {
            return Err("the configured ceilings are now lower than the reviewed limits".into());
        }
        for mount in &runnable.mounts {
            if !self
                .config
                .datasets
                .values()
                .any(|d| d.path == mount.source)
            {
                return Err(format!(
                    "the dataset mounted at {} is no longer configured",
                    mount.target
                ));
            }
        }
        if runnable.network.is_some() && self.egress.is_none() {
            return Err("the egress proxy is not running".into());
        }
        Ok(())
    }
}

/// Lowers every limit to its ceiling.
pub fn clamp(limits: &mut Limits, ceilings: &Ceilings) {
    limits.timeout_ms = limits.timeout_ms.clamp(1, ceilings.timeout_ms);
    limits.memory_mb = limits.memory_mb.clamp(16, ceilings.memory_mb);
    limits.cpus = limits.cpus.clamp(0.01, ceilings.cpus);
    // The pids cgroup also counts gVisor's own threads (44 for an idle sandbox, measured):
    // below this floor sandboxes die at random.
    limits.pids = limits.pids.clamp(MIN_PIDS, ceilings.pids.max(MIN_PIDS));
    limits.disk_mb = limits.disk_mb.clamp(1, ceilings.disk_mb);
    limits.output_bytes = limits.output_bytes.min(ceilings.output_bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            timeout_ms: 999_999,
            memory_mb: 99_999,
            cpus: 64.0,
            pids: 1,
            disk_mb: 99_999,
            output_bytes: u64::MAX,
        }
    }

    #[test]
    fn limits_are_clamped_to_ceilings_and_floor() {
        let mut l = limits();
        let ceilings = Ceilings::default();
        clamp(&mut l, &ceilings);
        assert_eq!(l.timeout_ms, ceilings.timeout_ms);
        assert_eq!(l.memory_mb, ceilings.memory_mb);
        assert_eq!(l.cpus, ceilings.cpus);
        assert_eq!(l.pids, MIN_PIDS);
        assert_eq!(l.disk_mb, ceilings.disk_mb);
        assert_eq!(l.output_bytes, ceilings.output_bytes);
    }
}
