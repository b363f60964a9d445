//! envd's HTTP `/files`: `GET` downloads one file (`path`), `POST` uploads one or several,
//! as the E2B SDKs send them: `multipart/form-data` with one `file` part per file (its
//! filename the path; with one file the `path` query names it), or `application/octet-stream`
//! with the `path` query. Each file is a session file write (`app::session_files`: audited with
//! its SHA-256, confined to the sandbox's writable places, never through a symlink), its
//! missing parent directories made first, as E2B's envd does. One request carries at most
//! [`MAX_UPLOAD_BYTES`]; each file at most `sandbox_protocol::MAX_FILE_BYTES`. The SDK's
//! `username` is accepted and changes nothing (the sandbox has one unprivileged user).
//! Refusals speak E2B's error shape (`{code, message}`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::StreamExt as _;
use serde::Serialize;

use super::connect::ConnectError;
use super::envd::{reach, LiveState, Reached};
use super::error::E2bError;
use super::filesystem::absolute;
use crate::app::session_files::SessionFileError;
use crate::app::App;
use sandbox_protocol::{FileFailure, MAX_FILE_BYTES};

/// Largest upload request body: one file at the limit, with room for multipart's framing.
pub const MAX_UPLOAD_BYTES: usize = MAX_FILE_BYTES + 64 * 1024;

/// How much of an oversized upload is read and thrown away before the 413 is sent. A client
/// still writing its body when the server answers and closes gets a broken pipe instead of the
/// answer (the SDK then raises a transport error that says nothing about the limit); past this
/// bound the connection is closed regardless.
const MAX_DRAINED_BYTES: usize = 4 * MAX_UPLOAD_BYTES;

type Params = Query<BTreeMap<String, String>>;

/// `GET /files?path=`: the file's bytes.
pub async fn download(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    Query(params): Params,
    parts: Parts,
) -> Response {
    let reached = match reach(&app, &live, &parts).await {
        Ok(reached) => reached,
        Err(err) => return refusal(&err).into_response(),
    };
    let Some(path) = params.get("path").filter(|p| !p.is_empty()) else {
        return E2bError::new(StatusCode::BAD_REQUEST, "no path: which file to download?")
            .into_response();
    };
    let read = app
        .session_file_read(
            &reached.key,
            &reached.id,
            &absolute(&app, &reached, path).await,
        )
        .await;
    match read {
        Ok((_, bytes)) => (
            StatusCode::OK,
            [(CONTENT_TYPE, "application/octet-stream")],
            bytes,
        )
            .into_response(),
        Err(err) => file_error(err).into_response(),
    }
}

/// `POST /files`: writes each file; answers envd's `[{name, type, path}]`.
pub async fn upload(
    State(app): State<Arc<App>>,
    Extension(live): LiveState,
    Query(params): Params,
    parts: Parts,
    body: Body,
) -> Response {
    let reached = match reach(&app, &live, &parts).await {
        Ok(reached) => reached,
        Err(err) => return refusal(&err).into_response(),
    };
    match upload_files(&app, &reached, &params, &parts, body).await {
        Ok(written) => Json(written).into_response(),
        Err(err) => err.into_response(),
    }
}

/// The request body, at most [`MAX_UPLOAD_BYTES`]; over it, the rest is drained up to
/// [`MAX_DRAINED_BYTES`] so that the client reads the 413 rather than a reset connection.
async fn bounded_body(body: Body) -> Result<Vec<u8>, E2bError> {
    let mut stream = body.into_data_stream();
    let mut kept = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|err| E2bError::new(StatusCode::BAD_REQUEST, format!("upload: {err}")))?;
        seen = seen.saturating_add(chunk.len());
        if seen <= MAX_UPLOAD_BYTES {
            kept.extend_from_slice(&chunk);
        } else if seen > MAX_DRAINED_BYTES {
            break;
        }
    }
    if seen > MAX_UPLOAD_BYTES {
        return Err(E2bError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "an upload carries at most {MAX_UPLOAD_BYTES} bytes ({MAX_FILE_BYTES} per file)"
            ),
        ));
    }
    Ok(kept)
}

async fn upload_files(
    app: &App,
    reached: &Reached,
    params: &BTreeMap<String, String>,
    parts: &Parts,
    body: Body,
) -> Result<Vec<WriteInfo>, E2bError> {
    let body = bounded_body(body).await?;
    let files = uploaded(parts, params, &body)?;
    let mut written = Vec::with_capacity(files.len());
    for (path, content) in files {
        let path = absolute(app, reached, &path).await;
        make_parent(app, reached, &path).await?;
        let entry = app
            .session_file_write(&reached.key, &reached.id, &path, content, None)
            .await
            .map_err(file_error)?;
        written.push(WriteInfo {
            name: entry.name,
            entry_type: WrittenType::File,
            path: entry.path,
        });
    }
    Ok(written)
}

/// The files of a request body: (path as sent, bytes).
fn uploaded<'a>(
    parts: &Parts,
    params: &BTreeMap<String, String>,
    body: &'a [u8],
) -> Result<Vec<(String, &'a [u8])>, E2bError> {
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let query_path = params.get("path").filter(|p| !p.is_empty()).cloned();
    let media = content_type.split(';').next().unwrap_or("").trim();
    if media.eq_ignore_ascii_case("application/octet-stream") {
        let path = query_path.ok_or_else(|| {
            E2bError::new(
                StatusCode::BAD_REQUEST,
                "no path: where to write the upload?",
            )
        })?;
        return Ok(vec![(path, body)]);
    }
    if !media.eq_ignore_ascii_case("multipart/form-data") {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("content-type {media:?}: send multipart/form-data or application/octet-stream"),
        ));
    }
    let boundary = boundary(content_type).ok_or_else(|| {
        E2bError::new(
            StatusCode::BAD_REQUEST,
            "multipart/form-data without a boundary",
        )
    })?;
    let mut files = multipart(body, &boundary)?;
    if let (Some(path), [only]) = (query_path, files.as_mut_slice()) {
        only.0 = path;
    }
    if files.is_empty() {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "the upload has no file part",
        ));
    }
    Ok(files)
}

fn boundary(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|param| {
        let (name, value) = param.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"').to_owned())
            .filter(|b| !b.is_empty())
    })
}

/// The `file` parts of a multipart body (RFC 7578): (filename, content).
fn multipart<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<(String, &'a [u8])>, E2bError> {
    let malformed = |why: &str| {
        E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("malformed multipart body: {why}"),
        )
    };
    let delimiter = format!("--{boundary}");
    let next = format!("\r\n--{boundary}");
    let mut at =
        find(body, delimiter.as_bytes()).ok_or_else(|| malformed("no boundary"))? + delimiter.len();
    let mut files = Vec::new();
    loop {
        let rest = &body[at..];
        if rest.starts_with(b"--") {
            return Ok(files);
        }
        let rest = rest
            .strip_prefix(b"\r\n")
            .ok_or_else(|| malformed("boundary line"))?;
        let head_end = find(rest, b"\r\n\r\n").ok_or_else(|| malformed("part headers"))?;
        let head = String::from_utf8_lossy(&rest[..head_end]);
        let content_start = head_end + 4;
        let content_len = find(&rest[content_start..], next.as_bytes())
            .ok_or_else(|| malformed("unended part"))?;
        let content = &rest[content_start..content_start + content_len];
        if let Some(name) = filename(&head) {
            files.push((name, content));
        }
        at = body.len() - rest.len() + content_start + content_len + next.len();
    }
}

/// The `filename` of a part's `Content-Disposition` (the SDK sends the path there).
fn filename(head: &str) -> Option<String> {
    let line = head
        .split("\r\n")
        .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))?;
    let start = line.find("filename=\"")? + "filename=\"".len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].replace("%22", "\""))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let first = *needle.first()?;
    let mut from = 0;
    while let Some(offset) = haystack[from..].iter().position(|b| *b == first) {
        let at = from + offset;
        if haystack[at..].starts_with(needle) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// The file's directory and its missing parents (E2B's writes create them).
async fn make_parent(app: &App, reached: &Reached, path: &str) -> Result<(), E2bError> {
    let Some((parent, _)) = path.rsplit_once('/') else {
        return Ok(());
    };
    if parent.is_empty() || sandbox_protocol::locate(parent).is_err() {
        // The write itself refuses it, with the places named.
        return Ok(());
    }
    match app
        .session_file_mkdir(&reached.key, &reached.id, parent)
        .await
    {
        Ok(_) => Ok(()),
        Err(err) => Err(file_error(err)),
    }
}

/// A refusal of the sandbox's access (`envd::reach`) in E2B's error shape.
fn refusal(err: &ConnectError) -> E2bError {
    E2bError::new(err.code.http_status(), err.message.clone())
}

/// A file operation's refusal: 404 (the SDK's `FileNotFoundException`) when there is no such
/// file, 400 (`InvalidArgumentException`) for a malformed request, 403 for a path outside the
/// writable places or through a symlink, 413 over the size limit.
fn file_error(err: SessionFileError) -> E2bError {
    match err {
        SessionFileError::App(err) => E2bError::from(err),
        SessionFileError::Refused { failure, message } => {
            let status = match failure {
                FileFailure::NotFound => StatusCode::NOT_FOUND,
                FileFailure::Outside | FileFailure::Symlink | FileFailure::Denied => {
                    StatusCode::FORBIDDEN
                }
                FileFailure::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
                FileFailure::Exists => StatusCode::CONFLICT,
                FileFailure::NotADirectory
                | FileFailure::IsADirectory
                | FileFailure::NotAFile
                | FileFailure::Invalid => StatusCode::BAD_REQUEST,
                FileFailure::Io => StatusCode::INTERNAL_SERVER_ERROR,
            };
            E2bError::new(status, message)
        }
    }
}

/// envd's answer for one written file.
#[derive(Debug, Serialize)]
struct WriteInfo {
    name: String,
    #[serde(rename = "type")]
    entry_type: WrittenType,
    path: String,
}

/// envd's `type` of a written entry: uploads only ever write files.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "lowercase")]
enum WrittenType {
    File,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of `chunks` chunks of 1 MiB, counting how many were read.
    fn counted_body(chunks: usize) -> (Body, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let read = Arc::new(AtomicUsize::new(0));
        let counter = read.clone();
        let stream = futures_util::stream::iter(0..chunks).map(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(vec![0u8; 1 << 20])
        });
        (Body::from_stream(stream), read)
    }

    #[tokio::test]
    async fn an_oversized_upload_is_read_to_its_end_before_the_413() {
        use std::sync::atomic::Ordering;
        let chunks = MAX_UPLOAD_BYTES / (1 << 20) + 8;
        let (body, read) = counted_body(chunks);
        let err = bounded_body(body).await.unwrap_err();
        assert_eq!(err.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            read.load(Ordering::SeqCst),
            chunks,
            "the client must be able to finish writing and read the answer"
        );

        let endless = MAX_DRAINED_BYTES / (1 << 20) + 64;
        let (body, read) = counted_body(endless);
        assert!(bounded_body(body).await.is_err());
        assert!(read.load(Ordering::SeqCst) < endless, "draining is bounded");

        let (body, _) = counted_body(3);
        assert_eq!(bounded_body(body).await.unwrap().len(), 3 << 20);
    }

    #[test]
    fn multipart_parts_give_their_filenames_and_bytes() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a/b.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/c\"\r\n\r\n\x00\r\n--\r\n--XyZ--\r\n";
        let files = multipart(body, "XyZ").unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0], ("a/b.txt".to_owned(), &b"hello"[..]));
        assert_eq!(files[1], ("/tmp/c".to_owned(), &b"\x00\r\n--"[..]));
        assert_eq!(
            boundary("multipart/form-data; boundary=\"XyZ\"").as_deref(),
            Some("XyZ")
        );
        assert!(multipart(b"--XyZ\r\nno end", "XyZ").is_err());
    }
}
