//! The auditor's TCP login (`audit_listen`): `sandgate_auditor`'s password, read from the
//! configured file at each start and set on the embedded cluster, where `pg_hba.conf` lets
//! only that role in over TCP (see `embedded.rs`).

use std::path::{Path, PathBuf};

use sqlx::postgres::PgConnectOptions;
use sqlx::Connection;

use super::DatabaseError;

/// Longest password accepted.
const MAX_PASSWORD: usize = 256;
/// Shortest: a password guessable by brute force over the network is no lock.
const MIN_PASSWORD: usize = 12;

/// Reads the password file: one line (a trailing newline dropped), 12 to 256 bytes, no control
/// characters.
pub fn read_password(path: &Path) -> Result<String, DatabaseError> {
    let problem = |problem: String| DatabaseError::AuditorPassword {
        path: path.to_owned(),
        problem,
    };
    let text = std::fs::read_to_string(path).map_err(|err| problem(err.to_string()))?;
    let password = text.strip_suffix('\n').unwrap_or(&text);
    let password = password.strip_suffix('\r').unwrap_or(password);
    if password.len() < MIN_PASSWORD || password.len() > MAX_PASSWORD {
        return Err(problem(format!(
            "the password must be {MIN_PASSWORD} to {MAX_PASSWORD} bytes long, not {}",
            password.len()
        )));
    }
    if password.chars().any(char::is_control) {
        return Err(problem(
            "the password must be one line without control characters".to_owned(),
        ));
    }
    Ok(password.to_owned())
}

/// Lets `sandgate_auditor` log in with the file's password (hashed by the server, SCRAM).
pub async fn set_password(options: &PgConnectOptions, file: PathBuf) -> Result<(), DatabaseError> {
    let password = read_password(&file)?;
    // ALTER ROLE takes no bind parameters: the password goes in as a quoted literal (standard
    // conforming strings; it has no control characters).
    let statement = format!(
        "ALTER ROLE sandgate_auditor LOGIN PASSWORD '{}'",
        password.replace('\'', "''")
    );
    let mut conn = sqlx::PgConnection::connect_with(options)
        .await
        .map_err(DatabaseError::Connect)?;
    let done = set_on(&mut conn, statement).await;
    let closed = conn.close().await;
    done.map_err(DatabaseError::Connect)?;
    closed.map_err(DatabaseError::Connect)?;
    tracing::info!("sandgate_auditor may log in over TCP with the password of audit_listen");
    Ok(())
}

async fn set_on(conn: &mut sqlx::PgConnection, statement: String) -> Result<(), sqlx::Error> {
    sqlx::query("SET password_encryption = 'scram-sha-256'")
        .execute(&mut *conn)
        .await?;
    sqlx::query(&statement).execute(&mut *conn).await?;
    Ok(())
}
