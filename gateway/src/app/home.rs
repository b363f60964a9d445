//! A sandbox's host side: its egress socket directory and its `/output` tmpfs, both named by
//! the sandbox id and created before its container. An execution's grant is served in the
//! directory only once the execution has the sandbox; until then it is empty and the sandbox
//! reaches nothing.

use std::path::{Path, PathBuf};

use crate::outputs::OutputArea;

#[derive(Debug)]
pub struct SandboxHome {
    pub id: String,
    pub egress_dir: PathBuf,
    pub output: OutputArea,
}

impl SandboxHome {
    /// Creates `<egress_root>/<id>` and mounts `<scratch_root>/<id>` (`disk_mb`).
    pub fn create(
        egress_root: &Path,
        scratch_root: &Path,
        id: &str,
        disk_mb: u64,
    ) -> std::io::Result<SandboxHome> {
        let egress_dir = egress_root.join(id);
        // Only root (dockerd, runsc, the gateway) may traverse the root: no other host user
        // reaches a socket below it (SECURITY.md, issue 15 item 10).
        crate::egress::private_root(egress_root)?;
        std::fs::create_dir_all(&egress_dir)?;
        // Mounted at /run/sandgate: the sandbox user (65534) must reach the socket inside, and
        // gVisor checks this directory's and the socket's own modes.
        std::fs::set_permissions(
            &egress_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )?;
        let output = match OutputArea::create(scratch_root, id, disk_mb) {
            Ok(output) => output,
            Err(err) => {
                let _ = std::fs::remove_dir_all(&egress_dir);
                return Err(err);
            }
        };
        Ok(SandboxHome {
            id: id.to_owned(),
            egress_dir,
            output,
        })
    }

    /// Removes the egress directory and unmounts the output area.
    pub fn remove(self) {
        if let Err(err) = std::fs::remove_dir_all(&self.egress_dir) {
            if err.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.egress_dir.display(), error = %err, "removing the egress directory failed");
            }
        }
        if let Err(err) = self.output.remove() {
            tracing::warn!(error = %err, "output area left behind for the sweep");
        }
    }
}

/// Removes socket directories whose sandbox is no longer live (left by a crash or a kill -9).
/// Listed before `is_live` is asked, so one created meanwhile is never seen.
pub fn sweep_egress(root: &Path, is_live: impl Fn(&str) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let names: Vec<String> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect();
    names
        .into_iter()
        .filter(|name| !is_live(name))
        .filter(|name| std::fs::remove_dir_all(root.join(name)).is_ok())
        .count()
}
