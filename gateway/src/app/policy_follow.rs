//! Loading the policy revision another replica announced, from the files that
//! replica stored with the revision (`policy_revision_files`), so every replica runs the same
//! bundle whether it came from a directory, an upload or a rollback there. The files are
//! written into a directory of their own under `<data_dir>/policy-incoming/` (plain relative
//! names only, as for an upload), loaded as a candidate that must read as that very revision,
//! and removed again; an accepted one is kept for rollback like any other.

use std::path::{Path, PathBuf};

use super::policy::Source;
use super::policy_upload::plain_relative;
use super::App;

impl App {
    /// Runs `revision` here (announced by replica `by`); the error says why it does not.
    pub(super) async fn follow_revision(&self, revision: &str, by: &str) -> Result<(), String> {
        if self.policy.current().state.revision() == revision {
            return Ok(());
        }
        let files = self
            .audit
            .policy_sources(revision)
            .await
            .map_err(|err| format!("its files cannot be read: {}", super::error_chain(&err)))?;
        if files.is_empty() {
            return Err("the database holds no files for it".to_owned());
        }
        // Removed when dropped, on every path.
        let root = self.config.data_dir.join("policy-incoming");
        let scratch = super::policy::scratch_dir(&root, "follow-")?;
        let dir = scratch.path().join("bundle");
        let target = dir.clone();
        let written = tokio::task::spawn_blocking(move || write_bundle(&target, &files))
            .await
            .unwrap_or_else(|err| Err(format!("writing its files failed: {err}")));
        written?;
        let source = Source::Stored(dir, revision.to_owned());
        let loaded_by = format!("replica:{by}");
        self.policy
            .reload_from(&self.audit, &loaded_by, source)
            .await
            .map(|_| ())
            .map_err(|err| super::error_chain(&err))
    }
}

/// Writes the bundle's files under `dir` (which must not exist yet).
fn write_bundle(dir: &Path, files: &[policy_engine::SourceFile]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|err| format!("{}: {err}", dir.display()))?;
    for file in files {
        let rel: PathBuf = plain_relative(Path::new(&file.path))
            .filter(|rel| !rel.as_os_str().is_empty())
            .ok_or_else(|| {
                format!(
                    "stored file name {:?} is not a plain relative path",
                    file.path
                )
            })?;
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|err| format!("{}: {err}", parent.display()))?;
        }
        std::fs::write(&path, &file.contents)
            .map_err(|err| format!("{}: {err}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> policy_engine::SourceFile {
        policy_engine::SourceFile {
            path: path.to_owned(),
            contents: "x".to_owned(),
        }
    }

    #[test]
    fn stored_files_are_written_under_the_directory_only() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("bundle");
        write_bundle(&dir, &[file("data/tenants.yaml"), file("execution.rego")]).unwrap();
        assert!(dir.join("data/tenants.yaml").is_file());
        for bad in [
            "../escape.rego",
            "/etc/abs.rego",
            "data/../../up.rego",
            ".hidden",
            "",
        ] {
            let dir = root.path().join(uuid::Uuid::new_v4().to_string());
            let refused = write_bundle(&dir, &[file(bad)]);
            assert!(refused.is_err(), "{bad:?} was written");
        }
        assert!(!root.path().join("escape.rego").exists());
        assert!(!root.path().join("up.rego").exists());
    }
}
