//! The gateway's end-to-end tests, one binary: one module per area (a former test file each),
//! sharing one harness (`common`: a private PostgreSQL, the real dockerd with runsc, the gateway
//! served in-process) and `browser` (headless Chromium for the page tests). One binary links the
//! gateway once instead of once per file.
//!
//! Run one area or one test by its module path: `cargo test -p gateway --test e2e --
//! sessions::` or `-- sessions::an_oom_closes_the_session`. `make test` runs all of it, then
//! the isolation suites again against warm sandboxes (`WARM_SUITES`).
//!
//! Adding an area: put the tests in `gateway/tests/e2e/<area>.rs`, add `mod <area>;` below (in
//! order), and in that file write `use crate::common;` (and `use crate::browser;` for a page)
//! where a separate test file would have had `mod common;`. The crate root allows unwrap/expect
//! for every module (a panic is a failure report), so a module needs no `#![allow]` of its own.
//! Moving a stand-alone `gateway/tests/<area>.rs` in is the same three steps: `git mv` it here,
//! replace its `mod common;` line, drop its `#![allow(clippy::unwrap_used, ...)]` line. A file
//! it reads with `include_str!` is relative to this directory (`../routes.table`).
//!
//! Outside this binary, each for a reason:
//! - `fuzz_names.rs`: a proptest harness over a pure function; `make fuzz` runs it in release
//!   with many cases, and `make check` runs it (no service needed).
//! - `kubernetes_manifests.rs`: reads `deploy/kubernetes/` only; `make check` runs it without
//!   building this binary.
//! - `egress_credentials.rs`: installs a process-wide tracing subscriber at debug level to prove
//!   no credential value reaches the logs; in this binary it would capture (and slow) every
//!   other test's logging too.
//! - `dockerd_restart.rs`: starts, SIGKILLs and restarts a private dockerd with its own bridge
//!   and waits out its restart; alone it cannot race the other areas' containers for the two
//!   cores and its timing stays the daemon's.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure report

#[path = "../common/mod.rs"]
mod common;

mod browser;

mod access;
mod approvals;
mod audit_bundle;
mod audit_chain;
mod audit_export;
mod audit_listen;
mod audit_page;
mod audit_replayed;
mod cli;
mod cli_cancel;
mod dashboards;
mod e2b;
mod e2b_contexts;
mod e2b_files;
mod e2b_js;
mod e2b_network;
mod e2b_processes;
mod e2b_pty;
mod e2b_tenancy;
mod e2b_watch;
mod egress;
mod egress_hardening;
mod egress_inspect;
mod egress_tls;
mod executions;
mod fail_closed;
mod group_commit;
mod held_revocation;
mod init_end;
mod limits;
mod listing;
mod mcp;
mod metrics;
mod migrations;
mod openapi;
mod orchestration;
mod output_kept;
mod output_kept_cli;
mod pipeline;
mod policy;
mod policy_reload;
mod policy_reload_if_match;
mod proposals;
mod proposals_evidence;
mod proposals_keyboard;
mod proposals_page;
mod proposals_races;
mod proposals_unknown_values;
mod python_sdk;
mod records;
mod refusals;
mod repl;
mod replicas;
mod review_page;
mod routes;
mod sandbox_ends;
mod session_files;
mod session_files_memory;
mod session_forgery;
mod session_limits;
mod session_limits_replicas;
mod session_owner;
mod session_results;
mod session_review;
mod session_runner;
mod sessions;
mod situations;
mod snapshots;
mod snapshots_credentials;
mod snapshots_e2b;
mod snapshots_e2b_contexts;
mod snapshots_e2b_fork;
mod snapshots_faults;
mod snapshots_replicas;
mod snapshots_restart;
mod snapshots_review;
mod snapshots_stale;
mod store_unknown_values;
mod tls;
mod toolbox;
mod types_unknown_values;
mod unknown_values;
mod warm;
mod warm_keys;
mod warm_restore;
mod warm_shapes;
mod withdraw;
