//! Fuzzing of the job spec parser (`sandbox_init::spec`), the only input sandbox-init takes
//! before it acts: property-based (proptest), through the crate's public API only. `cargo test`
//! runs proptest's default number of cases; `make fuzz` runs many more (`PROPTEST_CASES`).
//!
//! Inputs: arbitrary bytes, mutations of the seed specs in `sandbox-init/fuzz/corpus/job/`, and
//! specs built from path pieces chosen to hit the traversal rules. Whatever `parse_job`
//! accepts must keep every promise of `Job`. Failures found are saved under
//! `tests/fuzz_spec.proptest-regressions` and replayed first: commit that file.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

use std::path::{Component, Path};

use proptest::prelude::*;

use sandbox_init::spec::{
    parse_job, read_spec_line, shown, validate_cwd, validate_file_path, Job, MAX_FILE_MODE,
    MAX_NONCE, MIN_NONCE, WRITABLE_ROOTS,
};

fn seeds() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/job");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    let seeds: Vec<Vec<u8>> = files
        .iter()
        .map(|path| std::fs::read(path).unwrap())
        .collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

/// A canonically spelled absolute path: only normal components after the root (or the root).
fn canonical(path: &Path) -> bool {
    if path == Path::new("/") {
        return true;
    }
    let mut components = path.components();
    components.next() == Some(Component::RootDir)
        && components.all(|c| matches!(c, Component::Normal(_)))
        && !path.to_string_lossy().ends_with('/')
}

/// Every promise of a parsed job.
fn job_keeps_its_promises(job: &Job) -> Result<(), TestCaseError> {
    prop_assert!(!job.argv.is_empty() && !job.argv[0].is_empty());
    prop_assert!(!job.argv.iter().any(|arg| arg.contains('\0')));
    prop_assert!(canonical(&job.cwd), "cwd {:?}", job.cwd);
    for file in &job.files {
        prop_assert!(canonical(&file.path), "file {:?}", file.path);
        let mut parts = file.path.components().skip(1);
        let root = parts
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or("");
        prop_assert!(WRITABLE_ROOTS.contains(&root), "file {:?}", file.path);
        prop_assert!(parts.next().is_some(), "the root itself: {:?}", file.path);
        prop_assert!(file.mode <= MAX_FILE_MODE);
    }
    for (name, value) in job.env.iter().flatten() {
        prop_assert!(!name.is_empty() && !name.contains(['=', '\0']) && !value.contains('\0'));
    }
    if let Some(proxy) = &job.proxy {
        prop_assert!(proxy.listen.ip().is_loopback() && proxy.listen.port() != 0);
        prop_assert!(canonical(&proxy.socket));
    }
    if let Some(nonce) = &job.exit_nonce {
        prop_assert!((MIN_NONCE..=MAX_NONCE).contains(&nonce.len()));
        prop_assert!(nonce.bytes().all(|b| b.is_ascii_alphanumeric()));
    }
    Ok(())
}

fn mutate(mut bytes: Vec<u8>, edits: &[(u8, usize, u8)]) -> Vec<u8> {
    for &(kind, at, byte) in edits {
        let len = bytes.len().max(1);
        match kind % 4 {
            0 if !bytes.is_empty() => bytes[at % len] = byte,
            1 => bytes.insert(at % (bytes.len() + 1), byte),
            2 if !bytes.is_empty() => {
                bytes.remove(at % len);
            }
            3 => bytes.truncate(at % (bytes.len() + 1)),
            _ => {}
        }
    }
    bytes
}

/// Path pieces that stress the rules: roots, traversal, empties, control and odd characters.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("workspace".to_owned()),
        Just("tmp".to_owned()),
        Just("output".to_owned()),
        Just("etc".to_owned()),
        Just("..".to_owned()),
        Just(".".to_owned()),
        Just(String::new()),
        Just("a\0b".to_owned()),
        Just("\u{2025}".to_owned()),
        Just("%2e%2e".to_owned()),
        Just("x".repeat(256)),
        "[a-z.]{1,6}",
        "\\PC{1,4}",
    ]
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(job) = parse_job(&bytes) {
            job_keeps_its_promises(&job)?;
        }
    }

    #[test]
    fn mutated_seeds_keep_the_promises(index in 0usize..3,
                                       edits in proptest::collection::vec((any::<u8>(), any::<usize>(), any::<u8>()), 0..8)) {
        let seeds = seeds();
        let bytes = mutate(seeds[index % seeds.len()].clone(), &edits);
        if let Ok(job) = parse_job(&bytes) {
            job_keeps_its_promises(&job)?;
        }
    }

    #[test]
    fn built_paths_stay_in_the_writable_roots(pieces in proptest::collection::vec(piece(), 0..6),
                                              trailing in any::<bool>(), mode in 0u32..0o2000) {
        let mut path = format!("/{}", pieces.join("/"));
        if trailing {
            path.push('/');
        }
        let accepted = validate_file_path(&path);
        if let Ok(accepted) = &accepted {
            prop_assert!(canonical(accepted), "{path:?}");
        }
        let _ = validate_cwd(&path);
        let spec = serde_json::json!({
            "argv": ["true"], "cwd": path,
            "files": [{"path": path, "content_b64": "", "mode": mode}],
        });
        match parse_job(spec.to_string().as_bytes()) {
            Ok(job) => {
                prop_assert!(accepted.is_ok() && mode <= MAX_FILE_MODE);
                job_keeps_its_promises(&job)?;
            }
            Err(err) => {
                // Refusals are one line, whatever the path held.
                prop_assert!(!err.to_string().contains('\n'), "{err}");
            }
        }
    }

    #[test]
    fn spec_lines_are_bounded(bytes in proptest::collection::vec(any::<u8>(), 0..300), limit in 1usize..200) {
        if let Ok(line) = read_spec_line(&bytes[..], limit) {
            prop_assert!(line.len() <= limit);
            prop_assert!(!line.contains(&b'\n'));
        }
    }

    #[test]
    fn shown_text_is_one_short_line(text in "\\PC{0,300}|[\\x00-\\x1f]{0,50}") {
        let out = shown(&text);
        prop_assert!(!out.chars().any(char::is_control), "{out:?}");
        prop_assert!(out.chars().count() <= 120 * 10 + 3);
    }
}
