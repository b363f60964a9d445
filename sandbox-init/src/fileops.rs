//! A session's file operations (`sandbox_protocol`'s `files` module), performed by the init
//! itself: read, write, stat, list, mkdir, rename, remove.
//!
//! The program may still run (a cell's leftovers live between turns) and may have planted
//! symlinks or swap directories while an operation runs, so no path is ever resolved by the
//! kernel in one go. A path is first normalised lexically (`.` dropped, `..` popped) and must
//! then lie in one of [`FILE_PLACES`]; from that place's directory each component is opened
//! with `O_DIRECTORY | O_NOFOLLOW` relative to the previous one (`openat`), so a symlink
//! anywhere on the way is refused (`symlink`), whatever it points to. The last component is
//! acted on relative to its parent's descriptor: files are opened with `O_NOFOLLOW |
//! O_NONBLOCK` (a FIFO cannot hold the init) through `/proc/self/fd/<parent>/<name>` (std
//! opens it; no `unsafe`), and must be regular; stat and listings use `fstatat` without
//! following; removal walks directories the same way and unlinks, never following. The init's
//! effective uid is the program's ([`crate::identity`]), so the kernel refuses whatever the
//! program itself could not do as well.

use std::fs::{File, Metadata, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};

use base64::Engine as _;
use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{readlinkat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use sandbox_protocol::{
    locate, FileAnswer, FileEntry, FileFailure, FileKind, FileRequest, InPlace, FILE_PLACES,
    MAX_FILE_BYTES, MAX_LIST_DEPTH, MAX_LIST_ENTRIES,
};

/// Mode of a file a write creates when the request names none.
const NEW_FILE_MODE: u32 = 0o644;
/// Mode of each directory mkdir creates.
const NEW_DIR_MODE: u32 = 0o755;
/// Deepest directory a recursive removal descends into.
const MAX_REMOVE_DEPTH: usize = 256;

/// A refusal: what kind, and a one-line message.
#[derive(Debug)]
struct Refused(FileFailure, String);

type Done<T> = Result<T, Refused>;

fn refused(failure: FileFailure, message: impl Into<String>) -> Refused {
    Refused(failure, message.into())
}

fn from_errno(errno: Errno, what: &str) -> Refused {
    let failure = match errno {
        Errno::ENOENT => FileFailure::NotFound,
        Errno::ENOTDIR => FileFailure::NotADirectory,
        Errno::EISDIR => FileFailure::IsADirectory,
        Errno::ELOOP => FileFailure::Symlink,
        Errno::EEXIST | Errno::ENOTEMPTY => FileFailure::Exists,
        // The places are separate file systems: a move between two of them is refused.
        Errno::EXDEV => FileFailure::Invalid,
        Errno::EACCES | Errno::EPERM | Errno::EROFS => FileFailure::Denied,
        Errno::EFBIG | Errno::ENOSPC | Errno::EDQUOT => FileFailure::TooLarge,
        _ => FileFailure::Io,
    };
    refused(failure, format!("{what}: {}", errno.desc()))
}

fn from_io(err: &io::Error, what: &str) -> Refused {
    match err.raw_os_error() {
        Some(code) => from_errno(Errno::from_raw(code), what),
        None => refused(FileFailure::Io, format!("{what}: {err}")),
    }
}

/// Performs one operation; every failure is an answer.
pub fn perform(request: &FileRequest) -> FileAnswer {
    let done = match request {
        FileRequest::Read { path } => read(path),
        FileRequest::Write {
            path,
            content_b64,
            mode,
        } => write(path, content_b64, *mode),
        FileRequest::Stat { path } => stat(path).map(|entry| FileAnswer::Entry { entry }),
        FileRequest::List { path, depth } => list(path, *depth),
        FileRequest::Mkdir { path } => mkdir(path),
        FileRequest::Rename { from, to } => rename(from, to),
        FileRequest::Remove { path } => remove(path).map(|()| FileAnswer::Removed),
    };
    done.unwrap_or_else(|Refused(failure, message)| FileAnswer::Failed { failure, message })
}

fn located(path: &str) -> Done<InPlace> {
    locate(path).map_err(|failure| {
        refused(
            failure,
            format!(
                "{} is not under {}",
                crate::spec::shown(path),
                FILE_PLACES.join(", ")
            ),
        )
    })
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Opens `name` in `parent` as a directory, never through a symlink. `O_NOFOLLOW` is not
/// enough: gVisor follows a final symlink to a directory when `O_DIRECTORY` is given (seen
/// with runsc here), so the entry is `lstat`ed first and the directory opened must be that
/// very one (same device and inode): a symlink there, or swapped in meanwhile, is refused.
fn open_dir_at(parent: RawFd, name: &str, shown: &str) -> Done<Dir> {
    let entry = fstatat(Some(parent), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .map_err(|errno| from_errno(errno, shown))?;
    match kind_of(&entry) {
        FileKind::Dir => {}
        FileKind::Symlink => {
            return Err(refused(
                FileFailure::Symlink,
                format!("{shown} is a symlink (not followed)"),
            ))
        }
        _ => {
            return Err(refused(
                FileFailure::NotADirectory,
                format!("{shown} is not a directory"),
            ))
        }
    }
    let dir = Dir::openat(Some(parent), name, DIR_FLAGS, Mode::empty())
        .map_err(|errno| from_errno(errno, shown))?;
    let opened = fstat(dir.as_raw_fd()).map_err(|errno| from_errno(errno, shown))?;
    if (opened.st_dev, opened.st_ino) != (entry.st_dev, entry.st_ino) {
        return Err(refused(
            FileFailure::Symlink,
            format!("{shown} changed while it was opened (a symlink is not followed)"),
        ));
    }
    Ok(dir)
}

/// The directory holding `names` (component by component from the place), open.
fn walk(place: &str, names: &[String]) -> Done<Dir> {
    let mut dir =
        Dir::open(place, DIR_FLAGS, Mode::empty()).map_err(|errno| from_errno(errno, place))?;
    let mut shown = place.to_owned();
    for name in names {
        shown.push('/');
        shown.push_str(name);
        dir = open_dir_at(dir.as_raw_fd(), name, &shown)?;
    }
    Ok(dir)
}

/// The directory at `path` (absolute, in a place), open the way every operation reaches one:
/// for a directory watcher ([`crate::watch`]).
pub(crate) fn open_dir(path: &str) -> Result<Dir, (FileFailure, String)> {
    let found = located(path).and_then(|at| walk(at.place, &at.below));
    found.map_err(|Refused(failure, message)| (failure, message))
}

/// The parent directory, open, and the last name; the place itself has none.
fn parent_of(at: &InPlace) -> Done<(Dir, String)> {
    let Some((name, parents)) = at.below.split_last() else {
        return Err(refused(
            FileFailure::Denied,
            format!("{} itself cannot be changed", at.place),
        ));
    };
    Ok((walk(at.place, parents)?, name.clone()))
}

fn kind_of(st: &FileStat) -> FileKind {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => FileKind::File,
        SFlag::S_IFDIR => FileKind::Dir,
        SFlag::S_IFLNK => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

fn entry_of(path: String, name: String, st: &FileStat, target: Option<String>) -> FileEntry {
    FileEntry {
        path,
        name,
        kind: kind_of(st),
        size: u64::try_from(st.st_size).unwrap_or(0),
        mode: st.st_mode & 0o7777,
        mtime_ns: st.st_mtime.saturating_mul(1_000_000_000) + st.st_mtime_nsec,
        symlink_target: target,
    }
}

/// `name` in `dir` as lstat sees it.
fn entry_at(dir: RawFd, name: &str, path: String) -> Done<FileEntry> {
    let st = fstatat(Some(dir), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .map_err(|errno| from_errno(errno, &path))?;
    let target = (kind_of(&st) == FileKind::Symlink)
        .then(|| readlinkat(Some(dir), name).ok())
        .flatten()
        .map(|target| String::from_utf8_lossy(target.as_bytes()).into_owned());
    Ok(entry_of(path, name.to_owned(), &st, target))
}

fn entry_of_file(path: String, name: String, meta: &Metadata) -> FileEntry {
    FileEntry {
        path,
        name,
        kind: FileKind::File,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        mtime_ns: meta.mtime().saturating_mul(1_000_000_000) + meta.mtime_nsec(),
        symlink_target: None,
    }
}

/// Opens `name` in `dir` as a file, never through a symlink, never waiting on a FIFO.
fn open_file_at(dir: &Dir, name: &str, options: &mut OpenOptions, shown: &str) -> Done<File> {
    let through = format!("/proc/self/fd/{}/{name}", dir.as_raw_fd());
    let file = options
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(through)
        .map_err(|err| from_io(&err, shown))?;
    let meta = file.metadata().map_err(|err| from_io(&err, shown))?;
    if !meta.is_file() {
        return Err(refused(
            FileFailure::NotAFile,
            format!("{shown} is not a regular file"),
        ));
    }
    Ok(file)
}

/// A read's answer line: the bytes encoded straight into it (`content_answer`).
pub fn read_answer(nonce: &str, path: &str) -> Vec<u8> {
    match read_bytes(path) {
        Ok((content, entry)) => sandbox_protocol::content_answer(nonce, &content, &entry),
        Err(Refused(failure, message)) => {
            sandbox_protocol::file_answer(nonce, &FileAnswer::Failed { failure, message })
        }
    }
}

fn read(path: &str) -> Done<FileAnswer> {
    let (content, entry) = read_bytes(path)?;
    Ok(FileAnswer::Content {
        content_b64: base64::engine::general_purpose::STANDARD.encode(&content),
        entry,
    })
}

fn read_bytes(path: &str) -> Done<(Vec<u8>, FileEntry)> {
    let at = located(path)?;
    let shown = at.path();
    let (dir, name) = parent_of(&at)?;
    let mut file = open_file_at(&dir, &name, OpenOptions::new().read(true), &shown)?;
    let meta = file.metadata().map_err(|err| from_io(&err, &shown))?;
    let too_large = || {
        refused(
            FileFailure::TooLarge,
            format!("{shown} is larger than {MAX_FILE_BYTES} bytes"),
        )
    };
    if meta.len() > MAX_FILE_BYTES as u64 {
        return Err(too_large());
    }
    let mut content = Vec::new();
    (&mut file)
        .take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut content)
        .map_err(|err| from_io(&err, &shown))?;
    if content.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    Ok((content, entry_of_file(shown, name, &meta)))
}

/// A write whose base64 is given up once decoded (a 16 MiB write otherwise holds both, 22 MB
/// and 16 MB, while the file is written).
pub fn write_owned(path: &str, content_b64: String, mode: Option<u32>) -> FileAnswer {
    let content = base64::engine::general_purpose::STANDARD
        .decode(&content_b64)
        .map_err(|err| refused(FileFailure::Invalid, format!("content_b64: {err}")));
    drop(content_b64);
    content
        .and_then(|content| write_bytes(path, &content, mode))
        .unwrap_or_else(|Refused(failure, message)| FileAnswer::Failed { failure, message })
}

fn write(path: &str, content_b64: &str, mode: Option<u32>) -> Done<FileAnswer> {
    let content = base64::engine::general_purpose::STANDARD
        .decode(content_b64)
        .map_err(|err| refused(FileFailure::Invalid, format!("content_b64: {err}")))?;
    write_bytes(path, &content, mode)
}

fn write_bytes(path: &str, content: &[u8], mode: Option<u32>) -> Done<FileAnswer> {
    let at = located(path)?;
    let shown = at.path();
    if mode.is_some_and(|mode| mode > 0o777) {
        return Err(refused(FileFailure::Invalid, "mode must be within 0o777"));
    }
    if content.len() > MAX_FILE_BYTES {
        return Err(refused(
            FileFailure::TooLarge,
            format!(
                "{} bytes is over the limit of {MAX_FILE_BYTES}",
                content.len()
            ),
        ));
    }
    let (dir, name) = parent_of(&at)?;
    let created = open_file_at(
        &dir,
        &name,
        OpenOptions::new().write(true).create_new(true).mode(0o600),
        &shown,
    );
    let (mut file, mode) = match created {
        Ok(file) => (file, Some(mode.unwrap_or(NEW_FILE_MODE))),
        Err(Refused(FileFailure::Exists, _)) => {
            let file = open_file_at(&dir, &name, OpenOptions::new().write(true), &shown)?;
            (file, mode)
        }
        Err(refused) => return Err(refused),
    };
    let failed = |err: io::Error| from_io(&err, &shown);
    file.set_len(0).map_err(failed)?;
    file.write_all(content).map_err(failed)?;
    if let Some(mode) = mode {
        // fchmod, not the open mode: the umask must not change what was asked for.
        file.set_permissions(Permissions::from_mode(mode))
            .map_err(failed)?;
    }
    let meta = file.metadata().map_err(failed)?;
    Ok(FileAnswer::Entry {
        entry: entry_of_file(shown, name, &meta),
    })
}

fn stat(path: &str) -> Done<FileEntry> {
    let at = located(path)?;
    let shown = at.path();
    match at.below.split_last() {
        None => {
            let dir = walk(at.place, &[])?;
            let st = fstat(dir.as_raw_fd()).map_err(|errno| from_errno(errno, &shown))?;
            let name = at.place.rsplit('/').next().unwrap_or_default().to_owned();
            Ok(entry_of(shown, name, &st, None))
        }
        Some((name, parents)) => entry_at(walk(at.place, parents)?.as_raw_fd(), name, shown),
    }
}

/// A listing under way.
struct Listing {
    entries: Vec<FileEntry>,
    truncated: bool,
}

fn list(path: &str, depth: u32) -> Done<FileAnswer> {
    if !(1..=MAX_LIST_DEPTH).contains(&depth) {
        return Err(refused(
            FileFailure::Invalid,
            format!("depth must be 1 to {MAX_LIST_DEPTH}"),
        ));
    }
    let at = located(path)?;
    let dir = walk(at.place, &at.below)?;
    let mut listing = Listing {
        entries: Vec::new(),
        truncated: false,
    };
    list_into(dir, &at.path(), depth, &mut listing)?;
    Ok(FileAnswer::Entries {
        entries: listing.entries,
        truncated: listing.truncated,
    })
}

fn list_into(mut dir: Dir, shown: &str, depth: u32, listing: &mut Listing) -> Done<()> {
    let fd = dir.as_raw_fd();
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(|errno| from_errno(errno, shown))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(String::from_utf8_lossy(name).into_owned());
        }
    }
    names.sort();
    for name in names {
        if listing.entries.len() >= MAX_LIST_ENTRIES {
            listing.truncated = true;
            return Ok(());
        }
        let path = format!("{shown}/{name}");
        // Gone meanwhile, or unreadable: not listed.
        let Ok(entry) = entry_at(fd, &name, path.clone()) else {
            continue;
        };
        let descend = entry.kind == FileKind::Dir && depth > 1;
        listing.entries.push(entry);
        if descend {
            if let Ok(child) = open_dir_at(fd, &name, &path) {
                list_into(child, &path, depth - 1, listing)?;
            }
        }
    }
    Ok(())
}

fn mkdir(path: &str) -> Done<FileAnswer> {
    let at = located(path)?;
    let mut dir =
        Dir::open(at.place, DIR_FLAGS, Mode::empty()).map_err(|errno| from_errno(errno, path))?;
    let mut shown = at.place.to_owned();
    for name in &at.below {
        shown.push('/');
        shown.push_str(name);
        match mkdirat(
            Some(dir.as_raw_fd()),
            name.as_str(),
            Mode::from_bits_truncate(NEW_DIR_MODE),
        ) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(errno) => return Err(from_errno(errno, &shown)),
        }
        dir = open_dir_at(dir.as_raw_fd(), name, &shown)?;
    }
    stat(path).map(|entry| FileAnswer::Entry { entry })
}

fn rename(from: &str, to: &str) -> Done<FileAnswer> {
    let (source, target) = (located(from)?, located(to)?);
    let (from_dir, from_name) = parent_of(&source)?;
    let (to_dir, to_name) = parent_of(&target)?;
    renameat(
        Some(from_dir.as_raw_fd()),
        from_name.as_str(),
        Some(to_dir.as_raw_fd()),
        to_name.as_str(),
    )
    .map_err(|errno| from_errno(errno, &format!("{} -> {}", source.path(), target.path())))?;
    let entry = entry_at(to_dir.as_raw_fd(), &to_name, target.path())?;
    Ok(FileAnswer::Entry { entry })
}

fn remove(path: &str) -> Done<()> {
    let at = located(path)?;
    let shown = at.path();
    let (dir, name) = parent_of(&at)?;
    remove_at(&dir, &name, &shown, 0)
}

/// Removes `name` in `dir`: a directory after everything under it, anything else unlinked.
fn remove_at(dir: &Dir, name: &str, shown: &str, depth: usize) -> Done<()> {
    let st = fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .map_err(|errno| from_errno(errno, shown))?;
    if kind_of(&st) != FileKind::Dir {
        return unlinkat(Some(dir.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir)
            .map_err(|errno| from_errno(errno, shown));
    }
    if depth >= MAX_REMOVE_DEPTH {
        return Err(refused(
            FileFailure::Io,
            format!("{shown}: deeper than {MAX_REMOVE_DEPTH} levels"),
        ));
    }
    let mut child = open_dir_at(dir.as_raw_fd(), name, shown)?;
    let mut names = Vec::new();
    for entry in child.iter() {
        let entry = entry.map_err(|errno| from_errno(errno, shown))?;
        let bytes = entry.file_name().to_bytes();
        if bytes != b"." && bytes != b".." {
            names.push(String::from_utf8_lossy(bytes).into_owned());
        }
    }
    for inner in &names {
        remove_at(&child, inner, &format!("{shown}/{inner}"), depth + 1)?;
    }
    unlinkat(Some(dir.as_raw_fd()), name, UnlinkatFlags::RemoveDir)
        .map_err(|errno| from_errno(errno, shown))
}
