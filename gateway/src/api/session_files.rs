//! `/v1/sessions/{id}/files...`: the files of an open session's sandbox (`app::session_files`).
//! Agents only (the keys that may run code in the session). Paths are absolute, under
//! `/workspace`, `/tmp`, `/output` or `/home/user` (where the image has it), given in the query
//! string (`?path=`); `..` may not leave those places and no symlink is followed.
//!
//! - `GET    .../files?path=&depth=1`     a directory's entries (depth 1 to 16, at most 10,000);
//! - `GET    .../files/stat?path=`        one entry;
//! - `GET    .../files/content?path=`     the bytes (`application/octet-stream`, at most 16 MiB);
//! - `PUT    .../files/content?path=&mode=644`  create or replace a file with the body's bytes
//!   (at most 16 MiB: 413 beyond; `mode` octal), audited with the bytes' SHA-256;
//! - `POST   .../files/mkdir` `{"path"}`  a directory and its missing parents;
//! - `POST   .../files/move` `{"from","to"}`  move or rename, audited;
//! - `DELETE .../files?path=`             a file, symlink, or directory with all under it, audited.
//!
//! The role is checked before the query string is read (a reviewer gets 403, not 400).
//! While an execution runs in the session: 409. Refusals: outside the places, a symlink, or
//! what the sandbox's permissions refuse: 403; missing: 404; not a directory / not a regular
//! file / bad request: 400; exists: 409; too large: 413.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Path, State};
use axum::http::header::{CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use sha2::Digest as _;

use sandbox_protocol::{FileEntry, FileFailure, FileKind, MAX_FILE_BYTES};

use super::auth::Caller;
use super::error::{ApiError, ErrorCode};
use super::json::ApiJson;
use super::query::ApiQuery;
use crate::app::session_files::SessionFileError;
use crate::app::App;
use crate::role::Role;
use crate::session_wire::{
    SessionFileEntry, SessionFileKind, SessionFileList, SessionFileMkdir, SessionFileMove,
    SessionFileWritten,
};

/// `?path=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    path: String,
}

/// `?path=&depth=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    path: String,
    depth: Option<u32>,
}

/// `?path=&mode=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteQuery {
    path: String,
    /// Octal permission bits (`644`); absent: `644` for a new file, unchanged otherwise.
    mode: Option<String>,
}

impl From<SessionFileError> for ApiError {
    fn from(err: SessionFileError) -> ApiError {
        match err {
            SessionFileError::App(err) => ApiError::from(err),
            SessionFileError::Refused { failure, message } => {
                let code = match failure {
                    FileFailure::Outside | FileFailure::Symlink | FileFailure::Denied => {
                        ErrorCode::Forbidden
                    }
                    FileFailure::NotFound => ErrorCode::NotFound,
                    FileFailure::NotADirectory
                    | FileFailure::IsADirectory
                    | FileFailure::NotAFile
                    | FileFailure::Invalid => ErrorCode::InvalidRequest,
                    FileFailure::Exists => ErrorCode::Conflict,
                    FileFailure::TooLarge => ErrorCode::PayloadTooLarge,
                    FileFailure::Io => ErrorCode::Internal,
                };
                ApiError::new(code, message)
            }
        }
    }
}

fn view(entry: FileEntry) -> SessionFileEntry {
    SessionFileEntry {
        path: entry.path,
        name: entry.name,
        kind: match entry.kind {
            FileKind::File => SessionFileKind::File,
            FileKind::Dir => SessionFileKind::Dir,
            FileKind::Symlink => SessionFileKind::Symlink,
            FileKind::Other => SessionFileKind::Other,
        },
        size: entry.size,
        mode: entry.mode,
        mtime_ns: entry.mtime_ns,
        symlink_target: entry.symlink_target,
    }
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/files",
    tag = "sessions",
    operation_id = "session_files_list",
    summary = "A directory's entries in the session's sandbox (no symlink followed).",
    security(("bearer" = ["agent"])),
    params(
        ("id" = String, Path),
        ("path" = String, Query, description = "absolute, under /workspace, /tmp, /output or /home/user"),
        ("depth" = Option<u32>, Query, description = "levels, 1 (default) to 16"),
    ),
    responses(
        (status = 200, description = "the entries, at most 10,000", body = SessionFileList),
        (status = 409, description = "an execution runs in the session"),
        super::openapi::ApiErrors,
    ),
)]
pub async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<ApiQuery<ListQuery>, ApiError>,
) -> Result<Json<SessionFileList>, ApiError> {
    caller.require_role(&[Role::Agent])?;
    let ApiQuery(query) = query?;
    let depth = query.depth.unwrap_or(1);
    let listing = app
        .session_file_list(&caller.0, &id, &query.path, depth)
        .await?;
    Ok(Json(SessionFileList {
        entries: listing.entries.into_iter().map(view).collect(),
        truncated: listing.truncated,
    }))
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/files/stat",
    tag = "sessions",
    operation_id = "session_files_stat",
    summary = "One entry of the session's sandbox (a symlink shown as one).",
    security(("bearer" = ["agent"])),
    params(("id" = String, Path), ("path" = String, Query)),
    responses(
        (status = 200, description = "the entry", body = SessionFileEntry),
        super::openapi::ApiErrors,
    ),
)]
pub async fn stat(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<ApiQuery<PathQuery>, ApiError>,
) -> Result<Json<SessionFileEntry>, ApiError> {
    caller.require_role(&[Role::Agent])?;
    let ApiQuery(query) = query?;
    let entry = app.session_file_stat(&caller.0, &id, &query.path).await?;
    Ok(Json(view(entry)))
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/files/content",
    tag = "sessions",
    operation_id = "session_files_read",
    summary = "A regular file's bytes (at most 16 MiB; a symlink is refused).",
    security(("bearer" = ["agent"])),
    params(("id" = String, Path), ("path" = String, Query)),
    responses(
        (status = 200, description = "the bytes", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 413, description = "larger than 16 MiB"),
        super::openapi::ApiErrors,
    ),
)]
pub async fn read(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<ApiQuery<PathQuery>, ApiError>,
) -> Result<Response, ApiError> {
    caller.require_role(&[Role::Agent])?;
    let ApiQuery(query) = query?;
    let (_, bytes) = app.session_file_read(&caller.0, &id, &query.path).await?;
    let sha256 = hex::encode(sha2::Sha256::digest(&bytes));
    let mut response = bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if let Ok(value) = HeaderValue::from_str(&sha256) {
        headers.insert("x-sandgate-sha256", value);
    }
    Ok(response)
}

#[utoipa::path(
    put,
    path = "/v1/sessions/{id}/files/content",
    tag = "sessions",
    operation_id = "session_files_write",
    summary = "Create or replace a regular file with the body's bytes (audited with their SHA-256).",
    security(("bearer" = ["agent"])),
    params(
        ("id" = String, Path),
        ("path" = String, Query),
        ("mode" = Option<String>, Query, description = "octal permission bits, e.g. 755"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "the file written", body = SessionFileWritten),
        (status = 413, description = "larger than 16 MiB"),
        super::openapi::ApiErrors,
    ),
)]
pub async fn write(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<ApiQuery<WriteQuery>, ApiError>,
    body: axum::extract::Request,
) -> Result<Json<SessionFileWritten>, ApiError> {
    caller.require_role(&[Role::Agent])?;
    let ApiQuery(query) = query?;
    let mode = match &query.mode {
        None => None,
        Some(text) => Some(u32::from_str_radix(text, 8).map_err(|_| {
            ApiError::new(ErrorCode::InvalidRequest, "mode is octal digits, e.g. 644")
        })?),
    };
    let limited = axum::body::to_bytes(body.into_body(), MAX_FILE_BYTES);
    let bytes: Bytes = limited.await.map_err(|_| {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("a file is at most {MAX_FILE_BYTES} bytes"),
        )
    })?;
    let sha256 = hex::encode(sha2::Sha256::digest(&bytes));
    let entry = app
        .session_file_write(&caller.0, &id, &query.path, &bytes, mode)
        .await?;
    Ok(Json(SessionFileWritten {
        entry: view(entry),
        sha256,
    }))
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/files/mkdir",
    tag = "sessions",
    operation_id = "session_files_mkdir",
    summary = "Create a directory and its missing parents.",
    security(("bearer" = ["agent"])),
    params(("id" = String, Path)),
    request_body = SessionFileMkdir,
    responses(
        (status = 200, description = "the directory", body = SessionFileEntry),
        super::openapi::ApiErrors,
    ),
)]
pub async fn mkdir(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::extract::Request,
) -> Result<Json<SessionFileEntry>, ApiError> {
    caller.require_role(&[Role::Agent])?;
    let ApiJson(request) = ApiJson::<SessionFileMkdir>::from_request(body, &app).await?;
    let entry = app
        .session_file_mkdir(&caller.0, &id, &request.path)
        .await?;
    Ok(Json(view(entry)))
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/files/move",
    tag = "sessions",
    operation_id = "session_files_move",
    summary = "Move or rename (audited); an existing file at the destination is replaced.",
    security(("bearer" = ["agent"])),
    params(("id" = String, Path)),
    request_body = SessionFileMove,
    responses(
        (status = 200, description = "the entry at its new path", body = SessionFileEntry),
        super::openapi::ApiErrors,
    ),
)]
pub async fn rename(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    body: axum::extract::Request,
) -> Result<Json<SessionFileEntry>, ApiError> {
    caller.require_role(&[Role::Agent])?;
    let ApiJson(request) = ApiJson::<SessionFileMove>::from_request(body, &app).await?;
    let entry = app
        .session_file_rename(&caller.0, &id, &request.from, &request.to)
        .await?;
    Ok(Json(view(entry)))
}

#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}/files",
    tag = "sessions",
    operation_id = "session_files_remove",
    summary = "Remove a file, a symlink (not its target) or a directory with everything under it (audited).",
    security(("bearer" = ["agent"])),
    params(("id" = String, Path), ("path" = String, Query)),
    responses(
        (status = 204, description = "removed"),
        super::openapi::ApiErrors,
    ),
)]
pub async fn remove(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<ApiQuery<PathQuery>, ApiError>,
) -> Result<StatusCode, ApiError> {
    caller.require_role(&[Role::Agent])?;
    let ApiQuery(query) = query?;
    app.session_file_remove(&caller.0, &id, &query.path).await?;
    Ok(StatusCode::NO_CONTENT)
}
