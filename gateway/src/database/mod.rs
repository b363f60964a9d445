//! Where the audit store lives: the configured PostgreSQL server, or the embedded default.
//! Opening the database also runs the migrations, as the connecting user; every pooled
//! connection then acts as [`APP_ROLE`], which may append to `audit_events` but not change it.

mod auditor;
pub mod embedded;

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};

use crate::config::Config;
pub use embedded::EmbeddedPostgres;

/// Name of the database sandgate creates inside the embedded cluster.
const EMBEDDED_DATABASE: &str = "sandgate";
/// The database role every pooled connection acts as (created by migration
/// `20261130000005_app_role.sql`): SELECT and INSERT only on `audit_events`.
pub const APP_ROLE: &str = "sandgate_app";
/// How long a request waits for a pooled connection before the store counts as unavailable.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum DatabaseError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("embedded PostgreSQL: {message}")]
    Embedded { message: String },
    #[error("invalid database_url")]
    Url(#[source] sqlx::Error),
    #[error("cannot connect to PostgreSQL")]
    Connect(#[source] sqlx::Error),
    #[error("database migrations failed")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    #[error("audit_listen.password_file {path}: {problem}")]
    AuditorPassword { path: PathBuf, problem: String },
    #[error("embedded PostgreSQL task failed: {0}")]
    Task(String),
}

/// An open audit database and, for the embedded default, the server process behind it.
#[derive(Debug)]
pub struct Database {
    pub pool: PgPool,
    embedded: Option<EmbeddedPostgres>,
}

impl Database {
    /// For `sandgate serve`: like [`Database::open`], and an embedded server found running (left
    /// by a gateway that was killed) is adopted: this process stops it on shutdown.
    pub async fn open_for_server(config: &Config) -> Result<Database, DatabaseError> {
        let mut db = Database::open(config).await?;
        if let Some(pg) = db.embedded.as_mut() {
            pg.adopt();
        }
        Ok(db)
    }

    /// Connects (starting the embedded server if no URL is configured) and migrates. An
    /// embedded server that was already running is left running on close.
    pub async fn open(config: &Config) -> Result<Database, DatabaseError> {
        let (options, embedded) = match &config.database_url {
            Some(url) => (
                PgConnectOptions::from_str(url).map_err(DatabaseError::Url)?,
                None,
            ),
            None => {
                let data_dir = config.data_dir.clone();
                let bin_dir = config.postgres_bin_dir.clone();
                let tcp = config.audit_listen.as_ref().map(|listen| listen.address);
                let pg = tokio::task::spawn_blocking(move || {
                    EmbeddedPostgres::start_listening(&data_dir, bin_dir.as_deref(), tcp)
                })
                .await
                .map_err(|err| DatabaseError::Task(err.to_string()))??;
                create_database_if_missing(&pg, EMBEDDED_DATABASE).await?;
                (pg.connect_options(EMBEDDED_DATABASE), Some(pg))
            }
        };
        migrate_as_owner(&options).await?;
        let password_file = match (&config.audit_listen, &embedded) {
            (Some(listen), Some(_)) => Some(listen.password_file.clone()),
            _ => None,
        };
        if let Some(file) = password_file {
            auditor::set_password(&options, file).await?;
        }
        Ok(Database {
            pool: pool(options).await?,
            embedded,
        })
    }

    pub fn embedded(&self) -> Option<&EmbeddedPostgres> {
        self.embedded.as_ref()
    }

    /// Closes the pool and stops the embedded server if this process started it (a command-line
    /// tool that found it running only disconnects, and says nothing about stopping it).
    pub async fn close(self) {
        self.pool.close().await;
        if let Some(pg) = self.embedded.filter(EmbeddedPostgres::owned) {
            let stopped = tokio::task::spawn_blocking(move || pg.stop()).await;
            match stopped {
                Ok(Ok(())) => tracing::info!("embedded PostgreSQL stopped"),
                Ok(Err(err)) => {
                    tracing::error!(error = %err, "stopping embedded PostgreSQL failed")
                }
                Err(err) => tracing::error!(error = %err, "stopping embedded PostgreSQL failed"),
            }
        }
    }
}

/// The gateway's pool, acting as [`APP_ROLE`]. Where the server lets [`APP_ROLE`] log in by
/// itself (the embedded cluster's trusted socket), every connection *is* that role, so nothing
/// run on it can `SET ROLE NONE` back to the owner. Otherwise (an external server that wants a
/// password) the owner's login starts each connection as [`APP_ROLE`] (the `role` start-up
/// parameter, so `RESET ROLE` returns to it); that needs the owner to be allowed to act as it,
/// and is logged, since the owner's rights are one `SET ROLE NONE` away.
pub async fn pool(options: PgConnectOptions) -> Result<PgPool, DatabaseError> {
    let options = options
        .application_name("sandgate")
        .options([("role", APP_ROLE)]);
    let pool_of = |options: PgConnectOptions| {
        PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
    };
    if options.get_username() != APP_ROLE {
        match pool_of(options.clone().username(APP_ROLE)).await {
            Ok(pool) => return Ok(pool),
            Err(err) => tracing::warn!(
                error = %err,
                owner = options.get_username(),
                "{APP_ROLE} cannot log in by itself; the pool logs in as the owner and acts as \
                 {APP_ROLE} through the role start-up parameter"
            ),
        }
    }
    pool_of(options).await.map_err(DatabaseError::Connect)
}

/// Runs the migrations on a connection of its own, as the connecting user (who owns the
/// tables), before any pooled connection acts as [`APP_ROLE`].
pub async fn migrate_as_owner(options: &PgConnectOptions) -> Result<(), DatabaseError> {
    // A pool of one rather than a bare connection: the migrator's future over a `&mut
    // PgConnection` is not `Send` for every lifetime, which `tokio::spawn` needs.
    let owner = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options.clone().application_name("sandgate"))
        .await
        .map_err(DatabaseError::Connect)?;
    let migrated = migrate(&owner).await;
    owner.close().await;
    migrated
}

/// Runs the migrations on `pool`, whose connections must act as the tables' owner (tests).
pub async fn migrate(pool: &PgPool) -> Result<(), DatabaseError> {
    sqlx::migrate!("../migrations")
        .run(pool)
        .await
        .map_err(DatabaseError::Migrate)
}

/// Creates `name` in the embedded cluster unless it exists.
pub async fn create_database_if_missing(
    pg: &EmbeddedPostgres,
    name: &str,
) -> Result<(), DatabaseError> {
    let mut conn = sqlx::PgConnection::connect_with(&pg.connect_options("postgres"))
        .await
        .map_err(DatabaseError::Connect)?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut conn)
            .await
            .map_err(DatabaseError::Connect)?;
    if !exists {
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        sqlx::query(&format!("CREATE DATABASE {quoted}"))
            .execute(&mut conn)
            .await
            .map_err(DatabaseError::Connect)?;
    }
    conn.close().await.map_err(DatabaseError::Connect)?;
    Ok(())
}
