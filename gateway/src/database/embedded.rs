//! The embedded default database: a private PostgreSQL cluster under the data directory,
//! run from the system's own `initdb`/`pg_ctl`, reachable through a Unix socket in a directory
//! only its owner can enter. No TCP listener, unless the admin asks for one for auditors
//! (`audit_listen`): then only `sandgate_auditor` may log in over TCP, with a password
//! (`pg_hba.conf` is rewritten at each start; see [`HBA`]).
//!
//! `initdb` refuses to run as root, so when sandgate runs as root the cluster runs as the
//! `postgres` system user, which owns `<data_dir>/pg`. That user must be able to enter
//! `data_dir`; when a parent is private (a clone under `/root`, mode 0700, or under a
//! `mktemp -d` directory) it cannot, and the cluster lives in [`RELOCATED_ROOT`]`/<hash of the
//! data_dir path>` instead (with a `data_dir` file naming the directory it belongs to). No
//! permission of the user's directories is changed.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nix::unistd::{Gid, Uid, User};
use sha2::{Digest, Sha256};
use sqlx::postgres::PgConnectOptions;

use super::DatabaseError;

/// Port number used only to name the socket file (`.s.PGSQL.5432`) when there is no TCP
/// listener; with `audit_listen`, its port names the socket instead.
const SOCKET_PORT: u16 = 5432;
/// The client authentication rules, written at each start: the socket (0700, reached only by
/// root and the cluster's user) is trusted; over TCP only the read-only auditor role, only
/// into the sandgate database, only with its password (SCRAM); everything else is refused.
const HBA: &str = "# Written by sandgate at each start of the embedded cluster; edits are lost.\n\
    local all all trust\n\
    host sandgate sandgate_auditor all scram-sha-256\n\
    host all all all reject\n";
/// `sun_path` is 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;
const SUPERUSER: &str = "postgres";
/// Where the clusters live whose `data_dir` the `postgres` user cannot enter (root only).
pub const RELOCATED_ROOT: &str = "/var/lib/sandgate/pg";

#[derive(Debug)]
pub struct EmbeddedPostgres {
    bin_dir: PathBuf,
    pgdata: PathBuf,
    socket_dir: PathBuf,
    log_file: PathBuf,
    run_as: Option<(Uid, Gid)>,
    /// The port (socket name and, with `tcp`, the TCP port) and the TCP listener, if any.
    port: u16,
    tcp: Option<SocketAddr>,
    /// True when this process started the server and so must stop it.
    owned: bool,
}

impl EmbeddedPostgres {
    /// Initialises the cluster if needed and starts it unless it is already running (then it is
    /// shared, not owned). Blocking: call from `spawn_blocking`.
    pub fn start(
        data_dir: &Path,
        bin_dir: Option<&Path>,
    ) -> Result<EmbeddedPostgres, DatabaseError> {
        EmbeddedPostgres::start_listening(data_dir, bin_dir, None)
    }

    /// [`EmbeddedPostgres::start`], listening on TCP at `tcp` too (for auditors).
    pub fn start_listening(
        data_dir: &Path,
        bin_dir: Option<&Path>,
        tcp: Option<SocketAddr>,
    ) -> Result<EmbeddedPostgres, DatabaseError> {
        let bin_dir = match bin_dir {
            Some(dir) => dir.to_owned(),
            None => find_bin_dir()?,
        };
        let run_as = run_as_user()?;
        let root = cluster_root(data_dir, run_as)?;
        let mut pg = EmbeddedPostgres {
            bin_dir,
            pgdata: root.join("data"),
            socket_dir: root.join("run"),
            log_file: root.join("postgres.log"),
            run_as,
            port: tcp.map_or(SOCKET_PORT, |address| address.port()),
            tcp,
            owned: false,
        };
        let socket = pg.socket_dir.join(format!(".s.PGSQL.{}", pg.port));
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(DatabaseError::Embedded {
                message: format!(
                    "socket path {} is longer than {MAX_SOCKET_PATH} bytes; use a shorter data_dir",
                    socket.display()
                ),
            });
        }
        pg.prepare_dirs(&root)?;
        if !pg.pgdata.join("PG_VERSION").exists() {
            pg.initdb()?;
        }
        if pg.is_running()? {
            if !socket.exists() {
                return Err(DatabaseError::Embedded {
                    message: format!(
                        "the embedded PostgreSQL in {} runs with another port than this \
                         configuration's (audit_listen changed since it started): stop what \
                         uses it (the gateway), then start again",
                        pg.pgdata.display()
                    ),
                });
            }
            tracing::info!(pgdata = %pg.pgdata.display(), "using the running embedded PostgreSQL");
        } else {
            pg.write_hba()?;
            pg.pg_ctl_start()?;
            pg.owned = true;
            tracing::info!(pgdata = %pg.pgdata.display(), "started embedded PostgreSQL");
        }
        Ok(pg)
    }

    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(&self.socket_dir)
            .port(self.port)
            .username(SUPERUSER)
            .database(database)
    }

    pub fn pgdata(&self) -> &Path {
        &self.pgdata
    }

    /// The directory holding the socket (`host=` in a connection URL).
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    pub fn owned(&self) -> bool {
        self.owned
    }

    /// Makes this process responsible for stopping the server.
    pub fn adopt(&mut self) {
        self.owned = true;
    }

    /// Stops the server if this process started it. Blocking.
    pub fn stop(&self) -> Result<(), DatabaseError> {
        if !self.owned {
            return Ok(());
        }
        self.stop_now("fast")
    }

    /// Stops the server whoever started it (`mode`: smart, fast or immediate). Blocking.
    pub fn stop_now(&self, mode: &str) -> Result<(), DatabaseError> {
        let pgdata = self.pgdata.as_os_str();
        let args: [&OsStr; 8] = [
            "stop".as_ref(),
            "-D".as_ref(),
            pgdata,
            "-m".as_ref(),
            mode.as_ref(),
            "-w".as_ref(),
            "-t".as_ref(),
            "30".as_ref(),
        ];
        self.run("pg_ctl", &args).map(|_| ())
    }

    fn prepare_dirs(&self, root: &Path) -> Result<(), DatabaseError> {
        for dir in [root, self.socket_dir.as_path()] {
            std::fs::create_dir_all(dir).map_err(|err| io_error(dir, err))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|err| io_error(dir, err))?;
            if let Some((uid, gid)) = self.run_as {
                nix::unistd::chown(dir, Some(uid), Some(gid))
                    .map_err(|err| io_error(dir, std::io::Error::from_raw_os_error(err as i32)))?;
            }
        }
        Ok(())
    }

    fn write_hba(&self) -> Result<(), DatabaseError> {
        let path = self.pgdata.join("pg_hba.conf");
        std::fs::write(&path, HBA).map_err(|err| io_error(&path, err))?;
        if let Some((uid, gid)) = self.run_as {
            nix::unistd::chown(&path, Some(uid), Some(gid))
                .map_err(|err| io_error(&path, std::io::Error::from_raw_os_error(err as i32)))?;
        }
        Ok(())
    }

    /// The TCP listener for auditors, if configured.
    pub fn tcp(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// The port the socket file is named after (`.s.PGSQL.<port>`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `psql` (or another client program) of the same PostgreSQL installation.
    pub fn program(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    fn initdb(&self) -> Result<(), DatabaseError> {
        let pgdata = self.pgdata.as_os_str();
        let args: [&OsStr; 9] = [
            "-D".as_ref(),
            pgdata,
            "-U".as_ref(),
            SUPERUSER.as_ref(),
            "--auth=trust".as_ref(),
            "--encoding=UTF8".as_ref(),
            "--locale=C".as_ref(),
            "--no-instructions".as_ref(),
            "-N".as_ref(),
        ];
        // -N (no sync) only affects initdb's own files; the server itself runs with fsync on.
        self.run("initdb", &args)?;
        Ok(())
    }

    fn is_running(&self) -> Result<bool, DatabaseError> {
        let output = self
            .command("pg_ctl")
            .args(["status", "-D"])
            .arg(&self.pgdata)
            .output()
            .map_err(|err| io_error(&self.bin_dir.join("pg_ctl"), err))?;
        // pg_ctl status: 0 running, 3 not running, 4 no usable data directory.
        Ok(output.status.success())
    }

    fn pg_ctl_start(&self) -> Result<(), DatabaseError> {
        let socket_dir = self.socket_dir.to_string_lossy();
        if socket_dir.contains('\'') || socket_dir.contains('\\') {
            return Err(DatabaseError::Embedded {
                message: format!("data_dir must not contain quotes or backslashes: {socket_dir}"),
            });
        }
        // pg_ctl hands -o to the server through a shell; the path is single-quoted above.
        let listen = self
            .tcp
            .map(|address| address.ip().to_string())
            .unwrap_or_default();
        let options = format!(
            "-c listen_addresses='{listen}' -k '{socket_dir}' -p {} \
             -c unix_socket_permissions=0700 -c password_encryption=scram-sha-256",
            self.port
        );
        let pgdata = self.pgdata.as_os_str();
        let log = self.log_file.as_os_str();
        let args: [&OsStr; 11] = [
            "start".as_ref(),
            "-D".as_ref(),
            pgdata,
            "-l".as_ref(),
            log,
            "-w".as_ref(),
            "-t".as_ref(),
            "60".as_ref(),
            "-s".as_ref(),
            "-o".as_ref(),
            options.as_ref(),
        ];
        self.run("pg_ctl", &args).map(|_| ())
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(program));
        command
            .env_clear()
            .env("LANG", "C")
            .env("PATH", "/usr/bin:/bin");
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid.as_raw()).gid(gid.as_raw());
            // A working directory the unprivileged user can enter.
            command.current_dir("/");
        }
        command
    }

    fn run(&self, program: &str, args: &[&OsStr]) -> Result<Output, DatabaseError> {
        let output = self
            .command(program)
            .args(args)
            .output()
            .map_err(|err| io_error(&self.bin_dir.join(program), err))?;
        if !output.status.success() {
            let mut detail = String::from_utf8_lossy(&output.stderr).trim().to_owned();
            if program == "pg_ctl" {
                if let Ok(log) = std::fs::read_to_string(&self.log_file) {
                    let tail: Vec<&str> = log.lines().rev().take(5).collect();
                    detail.push_str(" | log: ");
                    detail.push_str(&tail.into_iter().rev().collect::<Vec<_>>().join(" / "));
                }
            }
            return Err(DatabaseError::Embedded {
                message: format!("{program} failed ({}): {detail}", output.status),
            });
        }
        Ok(output)
    }
}

/// `<data_dir>/pg`, or, when the cluster's user cannot enter `data_dir` (a private parent),
/// [`RELOCATED_ROOT`]`/<first 16 hex digits of sha256(absolute data_dir)>`, said in the log.
fn cluster_root(data_dir: &Path, run_as: Option<(Uid, Gid)>) -> Result<PathBuf, DatabaseError> {
    let data_dir = absolute(data_dir)?;
    let beside = data_dir.join("pg");
    let Some((uid, gid)) = run_as else {
        return Ok(beside);
    };
    std::fs::create_dir_all(&data_dir).map_err(|err| io_error(&data_dir, err))?;
    if can_enter(&data_dir, uid, gid)? {
        return Ok(beside);
    }
    let relocated = relocated_cluster_dir(&data_dir);
    std::fs::create_dir_all(&relocated).map_err(|err| io_error(&relocated, err))?;
    let note = relocated.join("data_dir");
    std::fs::write(&note, format!("{}\n", data_dir.display()))
        .map_err(|err| io_error(&note, err))?;
    tracing::info!(
        data_dir = %data_dir.display(),
        cluster = %relocated.display(),
        "user {SUPERUSER} cannot enter data_dir (a parent directory is private); \
         the embedded PostgreSQL cluster lives in {}",
        relocated.display()
    );
    Ok(relocated)
}

/// Where the cluster of the absolute `data_dir` lives when `postgres` cannot enter it.
pub fn relocated_cluster_dir(data_dir: &Path) -> PathBuf {
    let digest = Sha256::digest(data_dir.as_os_str().as_encoded_bytes());
    Path::new(RELOCATED_ROOT).join(hex::encode(&digest[..8]))
}

/// Whether `uid`/`gid` may traverse every directory down to and including `dir`, asked of the
/// kernel (`test -x` as that user, so ACLs count) rather than guessed from mode bits.
fn can_enter(dir: &Path, uid: Uid, gid: Gid) -> Result<bool, DatabaseError> {
    let test = Path::new("/usr/bin/test");
    let status = Command::new(test)
        .env_clear()
        .arg("-x")
        .arg(dir)
        .uid(uid.as_raw())
        .gid(gid.as_raw())
        .current_dir("/")
        .status()
        .map_err(|err| io_error(test, err))?;
    Ok(status.success())
}

/// Root cannot run `initdb`; run the cluster as the `postgres` system user instead.
fn run_as_user() -> Result<Option<(Uid, Gid)>, DatabaseError> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    match User::from_name(SUPERUSER) {
        Ok(Some(user)) => Ok(Some((user.uid, user.gid))),
        _ => Err(DatabaseError::Embedded {
            message: "running as root needs a `postgres` system user for the embedded database \
                      (apt-get install postgresql, or run scripts/setup.sh)"
                .to_owned(),
        }),
    }
}

fn find_bin_dir() -> Result<PathBuf, DatabaseError> {
    let mut candidates: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    candidates.sort();
    candidates
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| DatabaseError::Embedded {
            message:
                "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin; install them with \
                  `apt-get install postgresql` (scripts/setup.sh does), set postgres_bin_dir, \
                  or set SANDGATE_DATABASE_URL"
                    .to_owned(),
        })
}

fn absolute(path: &Path) -> Result<PathBuf, DatabaseError> {
    std::path::absolute(path).map_err(|err| io_error(path, err))
}

fn io_error(path: &Path, err: std::io::Error) -> DatabaseError {
    DatabaseError::Io {
        path: path.to_owned(),
        err,
    }
}
