//! What a waiting sandbox is keyed by: the whole container a decision implies ([`PoolKey`]).
//!
//! Image, runtime, memory, CPU, pids, disk (which also sizes the `/workspace` and `/tmp`
//! tmpfs), the dataset mounts exactly as granted (read-only; a waiting sandbox has those and no
//! other), and whether it serves an execution or a session. runsc cannot change a live
//! sandbox's limits (`docker update` fails: runsc has no `update` command), so a claim takes a
//! sandbox of exactly its key; nothing is widened. Whether the decision grants network does
//! not change the container (network `none` and the socket directory either way; the grant is
//! the listener served at the claim), so it is not part of the key. The deadline and output cap
//! are the run's, set at the claim.

use std::path::PathBuf;

use policy_engine::Limits;

use super::floor::Runnable;
use crate::runtime::ReadOnlyMount;

/// What a sandbox is created with (the caller adds a decision's dataset mounts).
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub image: String,
    pub runtime: String,
    /// Memory, CPU, pids and disk; the deadline and output cap are zero (they are the run's).
    pub limits: Limits,
}

impl Shape {
    pub(super) fn of(runnable: &Runnable) -> Shape {
        Shape {
            image: runnable.image.clone(),
            runtime: runnable.runtime.clone(),
            limits: Limits {
                timeout_ms: 0,
                output_bytes: 0,
                cpus: nano_rounded(runnable.limits.cpus),
                ..runnable.limits.clone()
            },
        }
    }
}

/// CPUs as Docker takes them (whole nano-CPUs), so equal quotas compare equal.
pub fn nano_rounded(cpus: f64) -> f64 {
    (cpus * 1e9).round() / 1e9
}

fn nano_cpus(cpus: f64) -> u64 {
    (cpus * 1e9).round().max(0.0) as u64
}

/// What a waiting sandbox will serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Serves {
    /// One execution (`sandbox-init pool`).
    Execution,
    /// One session (`sandbox-init session`), waiting for its opening line.
    Session,
}

/// A granted dataset as the key holds it: host source and `/data/...` target, read-only.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MountKey {
    pub source: PathBuf,
    pub target: String,
}

/// The whole container a decision implies; a claim takes a sandbox of exactly this key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    pub language: String,
    pub serves: Serves,
    pub image: String,
    pub runtime: String,
    pub memory_mb: u64,
    pub nano_cpus: u64,
    pub pids: u64,
    /// Also the size of the `/workspace` and `/tmp` tmpfs.
    pub disk_mb: u64,
    /// In the order granted.
    pub mounts: Vec<MountKey>,
}

impl PoolKey {
    pub(super) fn of(language: &str, serves: Serves, runnable: &Runnable) -> PoolKey {
        let shape = Shape::of(runnable);
        let mut key = PoolKey::of_shape(language, serves, &shape);
        key.mounts = runnable
            .mounts
            .iter()
            .map(|m| MountKey {
                source: m.source.clone(),
                target: m.target.clone(),
            })
            .collect();
        key
    }

    /// A key without dataset mounts (the configured default shape).
    pub fn of_shape(language: &str, serves: Serves, shape: &Shape) -> PoolKey {
        PoolKey {
            language: language.to_owned(),
            serves,
            image: shape.image.clone(),
            runtime: shape.runtime.clone(),
            memory_mb: shape.limits.memory_mb,
            nano_cpus: nano_cpus(shape.limits.cpus),
            pids: shape.limits.pids,
            disk_mb: shape.limits.disk_mb,
            mounts: Vec::new(),
        }
    }

    /// The container's shape (its mounts are [`PoolKey::mounts`]).
    pub fn shape(&self) -> Shape {
        Shape {
            image: self.image.clone(),
            runtime: self.runtime.clone(),
            limits: Limits {
                timeout_ms: 0,
                output_bytes: 0,
                memory_mb: self.memory_mb,
                cpus: self.nano_cpus as f64 / 1e9,
                pids: self.pids,
                disk_mb: self.disk_mb,
            },
        }
    }

    pub(super) fn read_only_mounts(&self) -> Vec<ReadOnlyMount> {
        self.mounts
            .iter()
            .map(|m| ReadOnlyMount {
                source: m.source.clone(),
                target: m.target.clone(),
            })
            .collect()
    }

    /// For `/readyz` and logs.
    pub fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "language": self.language,
            "serves": match self.serves { Serves::Execution => "execution", Serves::Session => "session" },
            "image": self.image,
            "memory_mb": self.memory_mb,
            "cpus": self.nano_cpus as f64 / 1e9,
            "pids": self.pids,
            "disk_mb": self.disk_mb,
            "mounts": self.mounts.iter().map(|m| serde_json::json!({"source": m.source, "target": m.target})).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A Python decision of `memory_mb` with read-only `mounts` (`/srv/<name>` at `/data/<name>`).
    pub(in crate::app) fn runnable(memory_mb: u64, mounts: &[&str]) -> Runnable {
        Runnable {
            backend: "gvisor".into(),
            runtime: "runsc".into(),
            image: "sandgate/python".into(),
            limits: Limits {
                timeout_ms: 30_000,
                memory_mb,
                cpus: 0.5,
                pids: 256,
                disk_mb: 64,
                output_bytes: 1024,
            },
            mounts: mounts
                .iter()
                .map(|name| ReadOnlyMount {
                    source: PathBuf::from(format!("/srv/{name}")),
                    target: format!("/data/{name}"),
                })
                .collect(),
            network: None,
        }
    }

    #[test]
    fn the_key_is_the_whole_container_and_nothing_else() {
        let small = PoolKey::of("python", Serves::Execution, &runnable(256, &[]));
        assert_eq!(
            small.memory_mb, 256,
            "Python under 512 MB is a key like any other"
        );
        assert_eq!(small.nano_cpus, 500_000_000);
        // The deadline and output cap are the run's, not the container's.
        let mut later = runnable(256, &[]);
        later.limits.timeout_ms = 1;
        later.limits.output_bytes = 1;
        assert_eq!(PoolKey::of("python", Serves::Execution, &later), small);
        let census = PoolKey::of("python", Serves::Execution, &runnable(256, &["census"]));
        assert_ne!(census, small);
        assert_eq!(census.read_only_mounts().len(), 1);
        assert_ne!(
            census,
            PoolKey::of("python", Serves::Execution, &runnable(256, &["survey"]))
        );
        assert_ne!(
            small,
            PoolKey::of("python", Serves::Session, &runnable(256, &[]))
        );
        assert_eq!(small.shape().limits.cpus, 0.5);
    }
}
