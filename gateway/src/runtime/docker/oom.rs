//! What the host's memory cgroup says about a sandbox: whether the OOM killer ran in it.
//!
//! Under runsc an OOM kills gVisor's kernel, not just the program: sandbox-init reports
//! nothing and the container ends with SIGKILL. dockerd learns of it from containerd's OOM
//! event, which can trail the exit or never come at all (the sandbox then read `killed` with
//! empty stderr), and the container's cgroup is gone by the time the exit is known (the
//! runtime removes it as the container stops), so its counters cannot be read afterwards.
//!
//! So each sandbox registers for the cgroup's own OOM notification while it lives (cgroup v1,
//! as on this project's hosts: docker's `cgroupfs` driver puts a sandbox in
//! `/sys/fs/cgroup/memory/docker/<id>`): an eventfd tied to `memory.oom_control` through
//! `cgroup.event_control`. The kernel signals it when the cgroup runs out of memory (before
//! the kill) and once more when the cgroup is removed. [`OomWatch::saw_oom`] tells them apart:
//! - while the cgroup still exists, any notification was an OOM, and `oom_kill` in
//!   `memory.oom_control` counts the kills;
//! - once it is gone, removal accounts for exactly one notification: two or more mean an OOM.
//!   One alone is ambiguous only until the removal's own notification arrives (it follows the
//!   directory's removal by moments), which is why the caller looks again for a while when a
//!   sandbox died without a word, as it does for dockerd's flag.
//!
//! On a host without a v1 memory hierarchy (cgroup v2 only) there is nothing to register with:
//! dockerd's flag is the only source, as before.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::eventfd::{EfdFlags, EventFd};

/// Most bytes read from `memory.oom_control` (three short lines).
const CONTROL_BYTES: usize = 256;

/// A registration for one sandbox's OOM notifications.
#[derive(Debug)]
pub(super) struct OomWatch {
    events: EventFd,
    control: File,
    notified: u64,
    oom: bool,
}

impl OomWatch {
    /// Registers for the OOM notifications of the memory cgroup process `pid` is in.
    pub(super) fn register(pid: i64) -> io::Result<OomWatch> {
        let dir = memory_cgroup_of(pid)?;
        let control = File::open(dir.join("memory.oom_control"))?;
        let events = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(io::Error::from)?;
        let line = format!("{} {}", events.as_raw_fd(), control.as_raw_fd());
        OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.event_control"))?
            .write_all(line.as_bytes())?;
        Ok(OomWatch {
            events,
            control,
            notified: 0,
            oom: false,
        })
    }

    /// Whether the cgroup said an OOM happened, from what it said so far (see the module docs).
    pub(super) fn saw_oom(&mut self) -> bool {
        if self.oom {
            return true;
        }
        // The notifications first, then whether the cgroup still exists: a removal's
        // notification follows the directory's removal, so if the read below succeeds, none
        // of the notifications counted here can be the removal's.
        match self.events.read() {
            Ok(count) => self.notified = self.notified.saturating_add(count),
            Err(Errno::EAGAIN) => {}
            Err(err) => tracing::warn!(error = %err, "reading the OOM eventfd failed"),
        }
        self.oom = match oom_kills(&self.control) {
            Some(kills) => kills > 0 || self.notified > 0,
            None => self.notified >= 2,
        };
        self.oom
    }
}

/// `oom_kill` from `memory.oom_control`, or `None` once the cgroup is gone.
fn oom_kills(control: &File) -> Option<u64> {
    let mut buf = [0u8; CONTROL_BYTES];
    let read = control.read_at(&mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..read]).ok()?;
    Some(
        text.lines()
            .find_map(|line| line.strip_prefix("oom_kill "))
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or(0),
    )
}

/// The v1 memory cgroup directory of `pid` on the host.
fn memory_cgroup_of(pid: i64) -> io::Result<PathBuf> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let path = memory_line(&cgroups).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "no cgroup v1 memory hierarchy (cgroup v2 only?)",
        )
    })?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    let (root, mount_point) = memory_mount(&mounts).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "the cgroup v1 memory hierarchy is not mounted in the gateway's namespace",
        )
    })?;
    let inside = Path::new(path)
        .strip_prefix(root)
        .map_err(|_| io::Error::new(io::ErrorKind::NotFound, "cgroup outside the mount"))?;
    Ok(Path::new(mount_point).join(inside))
}

/// The path of the `memory` controller's line in `/proc/<pid>/cgroup`.
fn memory_line(cgroups: &str) -> Option<&str> {
    cgroups.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        controllers
            .split(',')
            .any(|name| name == "memory")
            .then_some(path)
    })
}

/// The root and mount point of the v1 `memory` hierarchy in a `mountinfo`.
fn memory_mount(mountinfo: &str) -> Option<(&str, &str)> {
    mountinfo.lines().find_map(|line| {
        let (mount, tail) = line.split_once(" - ")?;
        let mut tail = tail.split(' ');
        let (kind, _source, options) = (tail.next()?, tail.next()?, tail.next()?);
        if kind != "cgroup" || !options.split(',').any(|option| option == "memory") {
            return None;
        }
        let mut fields = mount.split(' ');
        let root = fields.nth(3)?;
        let mount_point = fields.next()?;
        Some((root, mount_point))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_cgroup_is_found_from_proc_files() {
        let cgroups = "9:name=systemd:/docker/abc\n4:memory:/docker/abc\n0::/\n";
        assert_eq!(memory_line(cgroups), Some("/docker/abc"));
        assert_eq!(memory_line("0::/system.slice/docker-abc.scope\n"), None);
        let mountinfo = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
            35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";
        assert_eq!(
            memory_mount(mountinfo),
            Some(("/", "/sys/fs/cgroup/memory"))
        );
        assert_eq!(memory_mount("1 0 0:1 / / rw - ext4 /dev/vda rw\n"), None);
    }
}
