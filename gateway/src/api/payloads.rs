//! `GET /v1/executions/{id}/events` (Server-Sent Events) and
//! `GET /v1/executions/{id}/outputs/{path}` (a collected output file).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use api_types::{OutputEvent, StreamEventName};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header::{
    CONTENT_DISPOSITION, CONTENT_LENGTH, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, BoxStream, Stream, StreamExt};
use tokio_util::io::ReaderStream;

use super::auth::Caller;
use super::error::{ApiError, ErrorCode};
use crate::app::payloads::{DownloadBody, EventSource};
use crate::app::stream::StreamEvent;
use crate::app::App;

const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `stdout` and `stderr` events carry `{"text": ...}` as it arrives (coalesced: up to 16 KiB
/// and ~10 ms per event); the last event is `exit` with the final status (the same as
/// `GET /v1/executions/{id}` then shows). Each event has an `id:` (its position, from 1); a
/// client that reconnects with `Last-Event-ID: N` gets the events after the N-th.
#[utoipa::path(
    get,
    path = "/v1/executions/{id}/events",
    tag = "payloads",
    operation_id = "payloads_events",
    summary = "Server-Sent Events: `stdout`, `stderr` (`{\"text\"}`) as they happen, then `exit`.",
    security(("bearer" = ["agent", "reviewer", "auditor", "admin"])),
    params(
        ("id" = String, Path),
    ),
    responses(
        (status = 200, description = "an event stream", body = String, content_type = "text/event-stream"),
        super::openapi::ApiErrors,
    ),
)]
pub async fn events(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let resume = last_event_id(&headers)?;
    let source = app.execution_events(&caller.0, &id).await?;
    let events = match source {
        // Held for review: answer at once (keep-alives flow) and wait for the decision.
        EventSource::Pending => stream::once(async move {
            match app.execution_events_after_review(&caller.0, &id).await {
                Ok(source) => indexed(source, resume),
                Err(err) => {
                    tracing::warn!(execution_id = %id, error = ?err, "events after review");
                    stream::empty().boxed()
                }
            }
        })
        .flatten()
        .boxed(),
        source => indexed(source, resume),
    };
    Ok(
        Sse::new(events.map(|(index, event)| Ok(sse_event(index, event))))
            .keep_alive(KeepAlive::new().interval(KEEP_ALIVE)),
    )
}

/// The events of a decided execution with their positions, from `resume` on.
fn indexed(source: EventSource, resume: usize) -> BoxStream<'static, (usize, StreamEvent)> {
    match source {
        EventSource::Stored(events) => {
            let skip = resume.min(events.len());
            stream::iter(events.into_iter().enumerate().skip(skip)).boxed()
        }
        EventSource::Live(live) => {
            let from = resume.min(live.event_count());
            stream::unfold((live, from), |(live, from)| async move {
                let batch = live.next_batch(from).await?;
                let next = from + batch.len();
                Some((stream::iter((from..next).zip(batch)), (live, next)))
            })
            .flatten()
            .boxed()
        }
        EventSource::Pending => stream::empty().boxed(),
    }
}

/// The `Last-Event-ID` header: how many events the client already has (0 without it).
fn last_event_id(headers: &HeaderMap) -> Result<usize, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(0);
    };
    value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                "Last-Event-ID must be the id of an event of this stream (a whole number)",
            )
        })
}

fn sse_event(index: usize, event: StreamEvent) -> Event {
    let output = |text| serde_json::json!(OutputEvent { text });
    let (name, data) = match event {
        StreamEvent::Stdout(text) => (StreamEventName::Stdout, output(text)),
        StreamEvent::Stderr(text) => (StreamEventName::Stderr, output(text)),
        StreamEvent::Exit(summary) => (StreamEventName::Exit, summary),
    };
    Event::default()
        .event(name.as_str())
        .id((index + 1).to_string())
        .data(data.to_string())
}

/// The bytes of one collected file, as an attachment: never rendered by a browser.
#[utoipa::path(
    get,
    path = "/v1/executions/{id}/outputs/{path}",
    tag = "payloads",
    operation_id = "payloads_download",
    summary = "The bytes of one collected output file.",
    security(("bearer" = ["agent", "reviewer", "auditor", "admin"])),
    params(
        ("id" = String, Path),
        ("path" = String, Path),
    ),
    responses(
        (status = 200, description = "the file, as an attachment", body = Vec<u8>, content_type = "application/octet-stream"),
        super::openapi::ApiErrors,
    ),
)]
pub async fn download(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let download = app.output_file(&caller.0, &id, &path).await?;
    let name = download
        .entry
        .path
        .rsplit('/')
        .next()
        .unwrap_or("output")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect::<String>();
    let body = match download.body {
        DownloadBody::File(file) => {
            Body::from_stream(ReaderStream::new(tokio::fs::File::from_std(file)))
        }
        DownloadBody::Stored(bytes) => Body::from(bytes),
    };
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(download.entry.bytes));
    if let Ok(value) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        headers.insert(CONTENT_DISPOSITION, value);
    }
    if let Ok(value) = HeaderValue::from_str(&download.entry.sha256) {
        headers.insert("x-sandgate-sha256", value);
    }
    Ok(response)
}
