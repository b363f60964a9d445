//! Who the init and the program are, so that the program cannot signal its PID 1.
//!
//! Under gVisor a process may SIGKILL or SIGSTOP its PID 1 when it has the same uid (Linux
//! protects a namespace's init from such signals; this runsc does not), and so choose how its
//! own execution is recorded (`killed`, `timeout`) instead of its real exit. A signal needs the
//! sender's real or effective uid to equal the target's real or saved uid (or `CAP_KILL`), so
//! the init keeps a uid the program never has:
//!
//! | | real uid | effective uid | saved uid | gid (all three) | capabilities |
//! |---|---|---|---|---|---|
//! | the init, once [`settle`]d | [`INIT_UID`] | [`PROGRAM_UID`] | [`INIT_UID`] | [`PROGRAM_GID`] | none |
//! | the program (and the resident runners) | [`PROGRAM_UID`] | [`PROGRAM_UID`] | [`PROGRAM_UID`] | [`PROGRAM_GID`] | none |
//!
//! - the program cannot signal the init (`EPERM`): none of its uids is the init's real or saved
//!   uid; it cannot ptrace it or read its `/proc` files either (ptrace access needs all three
//!   uids equal, and the init is non-dumpable besides);
//! - the init can still signal the program (its effective uid is the program's real uid), and
//!   creates files as the program's user (file ownership follows the effective uid), so
//!   uploaded files and `/output` are the program's as before;
//! - gVisor's `execve` sets every uid to the *real* uid (it honours no set-user-ID bit), and
//!   Linux's keeps the real uid: so a child must hold the program's uid as its real uid when it
//!   execs the trampoline. The init [`lend`]s it: around each spawn (only ever at start-up,
//!   before any program runs: the one program of a cold or pooled sandbox, a session's runner)
//!   its real uid is the program's, and back to [`INIT_UID`] right after. Only while the init
//!   is single-threaded: glibc changes every thread's ids by signalling them, which crashes a
//!   static binary (SIGSEGV, seen under runsc), so the proxy bridge's threads start after the
//!   spawn ([`crate::bridge::bind`], then `serve`). The trampoline
//!   ([`crate::exec`], started as `exec --apart -- ...`) then waits until PID 1 is out of its
//!   reach (`kill(1, 0)` fails with `EPERM`) before it runs the program, so the program never
//!   runs while the init is lending, and never runs at all if the init could not take its
//!   uid back ([`wait_until_apart`]); it also makes the effective ids the whole identity
//!   ([`become_effective`]). Changing any of one's ids to one already held needs no capability.
//!
//! Getting there needs `CAP_SETUID` and `CAP_SETGID` once: the gateway starts the container as
//! root with exactly these two capabilities (all others dropped, `no-new-privileges`). [`settle`]
//! runs first thing, before anything is read; leaving uid 0 for ids that are all non-zero
//! clears the permitted and effective capability sets, so neither the init nor anything it
//! starts holds a capability afterwards. What stays is the bounding set (`CAP_SETUID`,
//! `CAP_SETGID`), which grants nothing to a non-root process under `no-new-privileges` (and
//! gVisor ignores set-user-ID bits on exec besides).
//!
//! Only PID 1 started as root settles: the init run as an ordinary process (the host tests,
//! `runsc-smoke.sh`'s uid-65534 containers) keeps the identity it was given.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::{getegid, geteuid, getpid, getresgid, getresuid, Gid, Uid};
use thiserror::Error;

/// The init's real and saved uid inside a sandbox: a uid nothing else in the sandbox has.
pub const INIT_UID: u32 = 65533;
/// The program's uid (`nobody`), and the init's effective uid.
pub const PROGRAM_UID: u32 = 65534;
/// The program's and the init's gid (`nogroup`).
pub const PROGRAM_GID: u32 = 65534;
/// How long the trampoline waits for the init to take its uid back.
const APART_WAIT: Duration = Duration::from_secs(2);
const APART_POLL: Duration = Duration::from_millis(1);

/// Set once [`settle`] took the init's identity.
static SETTLED: AtomicBool = AtomicBool::new(false);

#[derive(Debug, Error)]
pub enum IdentityError {
    #[error("dropping supplementary groups: {0} (the container needs CAP_SETGID)")]
    Groups(Errno),
    #[error("setting the gids: {0} (the container needs CAP_SETGID)")]
    Gids(Errno),
    #[error("setting the uids: {0} (the container needs CAP_SETUID)")]
    Uids(Errno),
    #[error("the ids did not change as asked")]
    Unchanged,
    #[error("PID 1 is still within the program's reach after {APART_WAIT:?}: refusing to run it")]
    NotApart,
    #[error("probing PID 1: {0}")]
    Probe(Errno),
    #[error("the init must be single-threaded when its uids change ({0} threads)")]
    Threads(usize),
}

/// As PID 1 started as root, or as an extra context's init started as root beside it
/// (`context`, `sandbox_protocol::SESSION_CONTEXT`, by `docker exec`): takes the init's identity
/// (see the module docs). Anything else: leaves the identity as it is.
pub fn settle(context: bool) -> Result<(), IdentityError> {
    if !(context || getpid().as_raw() == 1) || !Uid::current().is_root() {
        return Ok(());
    }
    let gid = Gid::from_raw(PROGRAM_GID);
    nix::unistd::setgroups(&[]).map_err(IdentityError::Groups)?;
    nix::unistd::setresgid(gid, gid, gid).map_err(IdentityError::Gids)?;
    let (init, program) = (Uid::from_raw(INIT_UID), Uid::from_raw(PROGRAM_UID));
    nix::unistd::setresuid(init, program, init).map_err(IdentityError::Uids)?;
    let uids = getresuid().map_err(IdentityError::Uids)?;
    let gids = getresgid().map_err(IdentityError::Gids)?;
    let settled = (uids.real, uids.effective, uids.saved) == (init, program, init)
        && (gids.real, gids.effective, gids.saved) == (gid, gid, gid);
    if !settled {
        return Err(IdentityError::Unchanged);
    }
    SETTLED.store(true, Ordering::SeqCst);
    Ok(())
}

/// Whether this process is a settled init (and so must [`lend`] around its spawns).
pub fn settled() -> bool {
    SETTLED.load(Ordering::SeqCst)
}

/// Runs `spawn` with the program's uid as the init's real uid (see the module docs), then
/// takes the init's back. Failing to take it back is an error (the trampoline then refuses to
/// run the program, and the init ends). Not settled: just `spawn`.
pub fn lend<T>(spawn: impl FnOnce() -> T) -> Result<T, IdentityError> {
    if !settled() {
        return Ok(spawn());
    }
    // Unreadable (no /proc): nothing to count by; the callers keep to the rule regardless.
    let threads = std::fs::read_dir("/proc/self/task").map_or(1, Iterator::count);
    if threads != 1 {
        return Err(IdentityError::Threads(threads));
    }
    let (init, program) = (Uid::from_raw(INIT_UID), Uid::from_raw(PROGRAM_UID));
    nix::unistd::setresuid(program, program, init).map_err(IdentityError::Uids)?;
    let spawned = spawn();
    nix::unistd::setresuid(init, program, init).map_err(IdentityError::Uids)?;
    Ok(spawned)
}

/// In the trampoline of a settled init: waits until its init (the parent: PID 1, or an extra
/// context's init) can no longer be signalled from here, at most [`APART_WAIT`]. Were the
/// init gone, the parent is PID 1 or a subreaper, out of reach all the same.
pub fn wait_until_apart() -> Result<(), IdentityError> {
    let started = Instant::now();
    let init = nix::unistd::getppid();
    loop {
        match kill(init, None) {
            Err(Errno::EPERM) => return Ok(()),
            Ok(()) if started.elapsed() < APART_WAIT => std::thread::sleep(APART_POLL),
            Ok(()) => return Err(IdentityError::NotApart),
            Err(errno) => return Err(IdentityError::Probe(errno)),
        }
    }
}

/// Makes the effective ids the whole identity (real, effective and saved), gids first (after
/// the uids change there would be no right left to change them). For the settled init's
/// child this is the program's identity; for a process whose ids are all equal, nothing.
pub fn become_effective() -> Result<(), IdentityError> {
    let (gid, uid) = (getegid(), geteuid());
    nix::unistd::setresgid(gid, gid, gid).map_err(IdentityError::Gids)?;
    nix::unistd::setresuid(uid, uid, uid).map_err(IdentityError::Uids)?;
    let uids = getresuid().map_err(IdentityError::Uids)?;
    if uids.real == uid && uids.saved == uid {
        Ok(())
    } else {
        Err(IdentityError::Unchanged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_pid_1_nothing_changes() {
        let before = (getresuid().unwrap(), getresgid().unwrap());
        settle(false).unwrap();
        become_effective().unwrap();
        let after = (getresuid().unwrap(), getresgid().unwrap());
        assert_eq!(
            (before.0.real, before.0.effective, before.1.real),
            (after.0.real, after.0.effective, after.1.real)
        );
    }
}
