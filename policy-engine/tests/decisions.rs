//! The shipped bundle's golden decision matrix (`policy_engine::matrix`) matches
//! `policies/tests/decisions.out`. Accept an intended change with
//! `sandgate policy test policies --bless` (or `SANDGATE_BLESS=1 cargo test -p policy-engine
//! --test decisions`) and commit the new file with the policy change.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a panic is a failure with a message"
)]

use std::path::{Path, PathBuf};

use policy_engine::matrix::{self, MatrixCheck};
use policy_engine::PolicyEngine;

fn policies_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
}

#[test]
fn golden_decision_matrix() {
    let engine = PolicyEngine::load(&policies_dir()).unwrap();
    let bless = std::env::var_os("SANDGATE_BLESS").is_some_and(|v| v == "1");
    match matrix::check(&engine, &policies_dir(), bless).unwrap() {
        MatrixCheck::Matches | MatrixCheck::Blessed => {}
        MatrixCheck::Absent => panic!("policies/{} is missing", matrix::MATRIX_FILE),
        MatrixCheck::Differs(changes) => panic!(
            "the shipped policy's decisions differ from policies/{}:\n{changes}\n\
             If the change is intended, accept it with\n  \
             sandgate policy test policies --bless\n\
             and commit the new file with the policy change.",
            matrix::MATRIX_FILE
        ),
    }
}

/// The matrix is a function of the policy alone: two runs print the same text.
#[test]
fn matrix_is_stable() {
    let engine = PolicyEngine::load(&policies_dir()).unwrap();
    assert_eq!(matrix::matrix(&engine), matrix::matrix(&engine));
}

#[test]
fn diff_names_changed_added_and_removed_lines() {
    let expected = "# c\na => 1\nb => 2\nc => 3\n";
    let actual = "# other comment\na => 1\nb => 5\nd => 4\n";
    assert_eq!(
        matrix::diff(expected, actual),
        "- b => 2\n+ b => 5\n- c => 3\n+ d => 4\n"
    );
}
