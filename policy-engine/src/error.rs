//! Errors from loading a policy bundle or its test cases. Evaluation never returns an error: it
//! denies instead.

use std::path::PathBuf;

/// Why a policy bundle (or its test cases) could not be loaded. The caller keeps its last good
/// bundle.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A file or directory of the bundle could not be read (or is not UTF-8).
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    /// The directory holds no `*.rego` file outside `tests/`.
    #[error("no .rego files in {}", dir.display())]
    NoPolicies { dir: PathBuf },
    /// A `.rego` file does not parse (regorus' message names the line and column).
    #[error("cannot parse policy {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    /// A data YAML file is malformed, not a mapping, or redefines a key another file defines.
    #[error("invalid policy data {}: {message}", path.display())]
    Data { path: PathBuf, message: String },
    /// The policies parse but do not compile together (unknown function, conflicting rules, ...).
    #[error("cannot compile policy bundle: {message}")]
    Compile { message: String },
    /// The bundle compiles but does not define the rule sandgate queries.
    #[error("policy bundle does not define {rule}")]
    MissingRule { rule: &'static str },
    /// The cases directory holds no `*.yaml` / `*.yml` case file.
    #[error("no case files (*.yaml) in {}", dir.display())]
    NoCases { dir: PathBuf },
    /// A case file is malformed: bad YAML, an unknown key or `expect` field, a duplicate name.
    #[error("invalid case file {}: {message}", path.display())]
    Cases { path: PathBuf, message: String },
}
