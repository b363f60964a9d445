//! `filesystem.Filesystem`'s watchers, the E2B SDKs' `files.watch_dir`: `CreateWatcher`,
//! `GetWatcherEvents`, `RemoveWatcher` (what the Python SDK's `WatchHandle` calls) and the
//! streamed `WatchDir` (the JS SDK's). Each is a watcher in the sandbox
//! (`App::start_session_watcher`: inotify, as the program's user, confined to the writable
//! places, no symlink followed), at most [`MAX_WATCHERS`] per sandbox. A created watcher's
//! events wait here, at most [`MAX_QUEUED`]; past that, or when the sandbox's kernel lost
//! events, the next `GetWatcherEvents` says so (`resource_exhausted`) instead of answering
//! with a silent gap. `GetWatcherEvents` first asks the watcher for what the kernel queued, so
//! a change made before the call is in its answer. A watcher ends with its sandbox (killed,
//! paused, closed) and with `RemoveWatcher`; watching is read-only and not audited.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::connect::{decode, end_stream, message, single_envelope, Code, ConnectError};
use super::envd::{answer_error, unary, Reached};
use super::filesystem::{absolute, file_error};
use crate::app::session_watch::SessionWatcher;
use crate::app::App;
use sandbox_protocol::{WatchKind, WatchLine};

/// Most watchers (created or streamed) at once per sandbox.
pub const MAX_WATCHERS: usize = 8;
/// Most events a created watcher keeps between two `GetWatcherEvents`, and a stream buffers.
pub const MAX_QUEUED: usize = 1024;
/// Longest wait for the watcher to hand over what the kernel queued.
const FLUSH_WAIT: Duration = Duration::from_secs(2);
/// Keepalives of a `WatchDir` stream when the SDK names no interval.
const KEEPALIVE: Duration = Duration::from_secs(30);

/// A sandbox's watchers.
#[derive(Debug, Default)]
pub struct Watchers {
    watching: Arc<AtomicUsize>,
    kept: Mutex<HashMap<String, Arc<Kept>>>,
}

/// One of a sandbox's [`MAX_WATCHERS`], given back when dropped.
#[derive(Debug)]
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A created watcher: its events waiting for `GetWatcherEvents`.
#[derive(Debug)]
struct Kept {
    state: Mutex<KeptState>,
    changed: Notify,
    requests: tokio::sync::Mutex<SessionWatcher>,
    pump: Mutex<Option<tokio::task::AbortHandle>>,
    _slot: Slot,
}

#[derive(Debug, Default)]
struct KeptState {
    events: VecDeque<(String, WatchKind)>,
    /// Events not kept: past [`MAX_QUEUED`], or lost in the sandbox (why).
    dropped: u64,
    lost: Option<String>,
    flushes: u64,
    ended: Option<String>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some(pump) = lock(&self.pump).take() {
            pump.abort();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Watchers {
    fn slot(&self, id: &str) -> Result<Slot, ConnectError> {
        let taken = self
            .watching
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                (now < MAX_WATCHERS).then_some(now + 1)
            });
        taken
            .map(|_| Slot(Arc::clone(&self.watching)))
            .map_err(|_| {
                ConnectError::new(
                    Code::ResourceExhausted,
                    format!("sandbox {id} already has {MAX_WATCHERS} watchers; stop one first"),
                )
            })
    }

    fn get(&self, watcher_id: &str) -> Result<Arc<Kept>, ConnectError> {
        lock(&self.kept).get(watcher_id).cloned().ok_or_else(|| {
            ConnectError::new(
                Code::NotFound,
                format!("watcher {watcher_id:?} is not watching in this sandbox"),
            )
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherIdRequest {
    #[serde(default)]
    watcher_id: String,
}

/// `FilesystemEvent` (no `entry`: envd 0.5.7's shape).
#[derive(Debug, Serialize)]
struct FilesystemEvent {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
}

impl FilesystemEvent {
    fn new(name: String, kind: WatchKind) -> FilesystemEvent {
        let kind = match kind {
            WatchKind::Create => "EVENT_TYPE_CREATE",
            WatchKind::Write => "EVENT_TYPE_WRITE",
            WatchKind::Remove => "EVENT_TYPE_REMOVE",
            WatchKind::Rename => "EVENT_TYPE_RENAME",
            WatchKind::Chmod => "EVENT_TYPE_CHMOD",
        };
        FilesystemEvent { name, kind }
    }
}

/// Starts a watcher of the request's directory, in one of the sandbox's slots.
async fn started(
    app: &App,
    reached: &Reached,
    request: WatchRequest,
) -> Result<(SessionWatcher, Slot), ConnectError> {
    let slot = reached.sandbox.watchers.slot(&reached.id)?;
    let path = absolute(&request.path);
    let watcher = app
        .start_session_watcher(&reached.key, &reached.id, &path, request.recursive)
        .await
        .map_err(file_error)?;
    Ok((watcher, slot))
}

/// `CreateWatcher`: `{watcherId}`.
pub(super) async fn create(
    app: &App,
    reached: &Reached,
    body: &[u8],
) -> Result<Response, ConnectError> {
    let (mut watcher, slot) = started(app, reached, decode(body)?).await?;
    let lines = std::mem::replace(&mut watcher.lines, futures_util::stream::empty().boxed());
    let kept = Arc::new(Kept {
        state: Mutex::new(KeptState::default()),
        changed: Notify::new(),
        requests: tokio::sync::Mutex::new(watcher),
        pump: Mutex::new(None),
        _slot: slot,
    });
    let pump = tokio::spawn(pump(Arc::downgrade(&kept), lines));
    *lock(&kept.pump) = Some(pump.abort_handle());
    let watcher_id = crate::ids::new("wt");
    lock(&reached.sandbox.watchers.kept).insert(watcher_id.clone(), kept);
    Ok(unary(&serde_json::json!({ "watcherId": watcher_id })))
}

/// Keeps a created watcher's lines until they end (or the watcher is removed).
async fn pump(
    kept: std::sync::Weak<Kept>,
    mut lines: futures_util::stream::BoxStream<'static, WatchLine>,
) {
    loop {
        let line = lines.next().await;
        let Some(kept) = kept.upgrade() else { return };
        let mut state = lock(&kept.state);
        match line {
            Some(WatchLine::Event { name, kind }) if state.events.len() < MAX_QUEUED => {
                state.events.push_back((name, kind));
            }
            Some(WatchLine::Event { .. }) => state.dropped += 1,
            Some(WatchLine::Lost { why }) => state.lost = Some(why),
            Some(WatchLine::Flushed) => state.flushes += 1,
            Some(WatchLine::Ready) => {}
            Some(WatchLine::Failed { message, .. }) => state.ended = Some(message),
            None => {
                state
                    .ended
                    .get_or_insert_with(|| "its sandbox was paused, killed or closed".to_owned());
            }
        }
        let ended = state.ended.is_some();
        drop(state);
        kept.changed.notify_waiters();
        if ended {
            return;
        }
    }
}

/// `GetWatcherEvents`: what happened since the last call (all of it, or an error saying what
/// was lost).
pub(super) async fn events(reached: &Reached, body: &[u8]) -> Result<Response, ConnectError> {
    let request: WatcherIdRequest = decode(body)?;
    let watchers = &reached.sandbox.watchers;
    let kept = watchers.get(&request.watcher_id)?;
    flush(&kept).await;
    let mut state = lock(&kept.state);
    if state.dropped > 0 || state.lost.is_some() {
        let why = match state.lost.take() {
            Some(why) => why,
            None => format!(
                "{} events came past the {MAX_QUEUED} a watcher keeps between two reads",
                state.dropped
            ),
        };
        state.dropped = 0;
        state.events.clear();
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!(
                "watcher {} lost events ({why}); its events until now are dropped, the next \
                 read has what follows",
                request.watcher_id
            ),
        ));
    }
    if state.events.is_empty() {
        if let Some(why) = state.ended.clone() {
            drop(state);
            lock(&watchers.kept).remove(&request.watcher_id);
            return Err(ConnectError::new(
                Code::NotFound,
                format!("watcher {} ended: {why}", request.watcher_id),
            ));
        }
    }
    let events: Vec<FilesystemEvent> = state
        .events
        .drain(..)
        .map(|(name, kind)| FilesystemEvent::new(name, kind))
        .collect();
    Ok(unary(&serde_json::json!({ "events": events })))
}

/// Has the watcher hand over what the kernel queued, and waits for it (a moment).
async fn flush(kept: &Kept) {
    let before = lock(&kept.state).flushes;
    if !kept.requests.lock().await.request_flush().await {
        return;
    }
    let waited = tokio::time::timeout(FLUSH_WAIT, async {
        loop {
            let changed = kept.changed.notified();
            {
                let state = lock(&kept.state);
                if state.flushes > before || state.ended.is_some() {
                    return;
                }
            }
            changed.await;
        }
    });
    let _ = waited.await;
}

/// `RemoveWatcher`: the watcher stops (its requests end).
pub(super) fn remove(reached: &Reached, body: &[u8]) -> Result<Response, ConnectError> {
    let request: WatcherIdRequest = decode(body)?;
    let removed = lock(&reached.sandbox.watchers.kept).remove(&request.watcher_id);
    match removed {
        Some(_) => Ok(unary(&serde_json::json!({}))),
        None => Err(ConnectError::new(
            Code::NotFound,
            format!(
                "watcher {:?} is not watching in this sandbox",
                request.watcher_id
            ),
        )),
    }
}

/// `WatchDir` (a server stream): a start event, then each event as it happens; a client too
/// slow for [`MAX_QUEUED`] events gets the stream ended with `resource_exhausted`.
pub(super) async fn watch_dir(
    app: &App,
    reached: &Reached,
    parts: &Parts,
    body: &[u8],
) -> Response {
    let request = single_envelope(body).and_then(decode::<WatchRequest>);
    let (watcher, slot) = match request {
        Ok(request) => match started(app, reached, request).await {
            Ok(started) => started,
            Err(err) => return answer_error(&err, true),
        },
        Err(err) => return answer_error(&err, true),
    };
    let every = parts
        .headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(KEEPALIVE, Duration::from_secs);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(MAX_QUEUED);
    tokio::spawn(stream_events(watcher, slot, tx, every));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(chunk), rx))
    });
    (
        StatusCode::OK,
        [(CONTENT_TYPE, super::connect::STREAM_CONTENT_TYPE)],
        Body::from_stream(stream),
    )
        .into_response()
}

async fn stream_events(
    mut watcher: SessionWatcher,
    _slot: Slot,
    tx: tokio::sync::mpsc::Sender<Bytes>,
    every: Duration,
) {
    let start = serde_json::json!({"start": {}});
    if tx.send(message(&start)).await.is_err() {
        return;
    }
    loop {
        let line = match tokio::time::timeout(every, watcher.lines.next()).await {
            Ok(line) => line,
            Err(_) => {
                if tx
                    .send(message(&serde_json::json!({"keepalive": {}})))
                    .await
                    .is_err()
                {
                    return;
                }
                continue;
            }
        };
        let ending = match line {
            Some(WatchLine::Event { name, kind }) => {
                let event = serde_json::json!({"filesystem": FilesystemEvent::new(name, kind)});
                match tx.try_send(message(&event)) {
                    Ok(()) => continue,
                    Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => return,
                    Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => ConnectError::new(
                        Code::ResourceExhausted,
                        format!("the client fell {MAX_QUEUED} events behind; watch again"),
                    ),
                }
            }
            Some(WatchLine::Lost { why }) => {
                ConnectError::new(Code::ResourceExhausted, format!("events were lost: {why}"))
            }
            Some(WatchLine::Ready | WatchLine::Flushed) => continue,
            Some(WatchLine::Failed { message, .. }) => {
                ConnectError::new(Code::Unavailable, format!("the watcher stopped: {message}"))
            }
            None => ConnectError::new(
                Code::Unavailable,
                "the watcher ended: its sandbox was paused, killed or closed",
            ),
        };
        let _ = tx.send(end_stream(Some(&ending))).await;
        return;
    }
}
