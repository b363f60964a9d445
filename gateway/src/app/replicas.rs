//! Replicas: several gateways on one PostgreSQL, coordinated through it alone.
//!
//! - **Leases.** Every [`lease period`](crate::config::Config::lease_ms) / 3 a replica renews
//!   its heartbeat and the lease of every record it runs, stops any run another replica closed
//!   meanwhile (it had been declared dead: its record stays closed), and closes the records of
//!   replicas whose leases expired (`closed by <me>: owner <them> lease expired`). It never
//!   touches another replica's containers: those are removed by their own replica's reaper,
//!   on their own dockerd, when it comes back.
//! - **Messages** (`LISTEN`/`NOTIFY`, one listening connection per replica):
//!   [`WATCH`] asks the replica running an execution to forward its live events to the
//!   asker's own channel ([`stream_channel`]), where they feed a mirror [`Stream`] at the same
//!   positions (the same SSE ids); [`CANCEL`] cancels an execution wherever it runs;
//!   [`POLICY`] announces a reloaded revision, which every other replica then loads from the
//!   files stored with it (`app::policy_follow`; or says, in `replicas.policy_error` and
//!   `/readyz`, why it runs another); `sandgate_turn` / `sandgate_turn_news` carry session
//!   requests to the replica holding the session (`app::session_relay`); `sandgate_purged`
//!   tells the replicas that ran purged executions to remove their files
//!   (`app::purged_outputs`); `sandgate_session_moved` tells a replica that another one
//!   restored a session it held paused (`app::snapshot_replicas`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::purged_outputs::PURGED;
use super::session_relay::{TURN, TURN_NEWS};
use super::snapshot_replicas::MOVED;
use super::stream::{Stream, StreamEvent};
use super::App;
use crate::runtime::Channel;

/// "Forward the events of `execution` to `watcher`".
pub const WATCH: &str = "sandgate_watch";
/// "Cancel `execution`" (whoever runs it does).
pub const CANCEL: &str = "sandgate_cancel";
/// "Revision `revision` was loaded by `by`".
pub const POLICY: &str = "sandgate_policy";
/// Output bytes per forwarded message: base64 of this plus the envelope stays under
/// PostgreSQL's 8000-byte notification limit.
const PIECE: usize = 4096;
/// How often a watcher asks again until the running replica answers.
const ASK_AGAIN: Duration = Duration::from_millis(500);
/// How long a watcher waits for the first forwarded message before it gives up on live output.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// The events channel of one replica.
pub fn stream_channel(instance: &str) -> String {
    format!("sandgate_stream_{instance}")
}

#[derive(Debug, Serialize, Deserialize)]
struct Watch {
    execution: String,
    watcher: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Cancel {
    execution: String,
    by: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct PolicyLoaded {
    revision: String,
    by: String,
}

/// One forwarded piece of an execution's events.
#[derive(Debug, Serialize, Deserialize)]
struct Piece {
    execution: String,
    #[serde(flatten)]
    part: Part,
}

/// An event is forwarded with its position in the running replica's stream (`index`), cut into
/// pieces under the payload limit (`more`: another piece of it follows), so the mirror holds
/// the same events at the same positions: the same SSE ids, and a `Last-Event-ID` from one
/// replica resumes on the other.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "part", rename_all = "snake_case")]
enum Part {
    /// The running replica has the execution, holds `events` events so far, and forwards from
    /// its first event.
    Hello { events: usize },
    Stdout {
        index: usize,
        b64: String,
        more: bool,
    },
    Stderr {
        index: usize,
        b64: String,
        more: bool,
    },
    Exit {
        index: usize,
        summary: serde_json::Value,
    },
}

/// This replica's side of the coordination.
#[derive(Debug, Default)]
pub struct Replicas {
    /// Live events of executions running elsewhere, fed from their replica, by execution id.
    mirrors: Mutex<HashMap<String, Mirror>>,
    /// (execution, watcher) pairs this replica forwards to.
    forwarding: Mutex<HashSet<(String, String)>>,
    /// Why this replica does not run the revision another one announced.
    policy_error: Mutex<Option<String>>,
    /// Session requests this replica relayed to the one holding the session.
    pub(super) turns: super::session_relay::Waiting,
    /// Where the sweep of this replica's purged records stopped.
    pub(super) swept_to: super::purged_outputs::SweptTo,
}

#[derive(Debug, Clone)]
struct Mirror {
    stream: Arc<Stream>,
    /// The running replica's event count when it answered (`None`: not yet).
    answered: tokio::sync::watch::Sender<Option<usize>>,
    /// The pieces so far of the event being received.
    partial: Arc<Mutex<Vec<u8>>>,
}

impl Mirror {
    fn answered(&self) -> bool {
        self.answered.borrow().is_some()
    }

    /// A piece of output event `index`; the whole event joins the mirror with its last piece.
    fn piece(&self, index: usize, channel: Channel, bytes: &[u8], more: bool) {
        let mut partial = self.partial.lock().unwrap_or_else(PoisonError::into_inner);
        partial.extend_from_slice(bytes);
        if more {
            return;
        }
        let text = String::from_utf8_lossy(&partial).into_owned();
        partial.clear();
        drop(partial);
        let event = match channel {
            Channel::Stdout => StreamEvent::Stdout(text),
            Channel::Stderr => StreamEvent::Stderr(text),
        };
        if !self.stream.push_at(index, event) {
            tracing::warn!(
                index,
                "a forwarded event is missing; the mirrored stream stops carrying output"
            );
        }
    }
}

impl Replicas {
    fn mirrors(&self) -> std::sync::MutexGuard<'_, HashMap<String, Mirror>> {
        self.mirrors.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn forwarding(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String)>> {
        self.forwarding
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub fn policy_error(&self) -> Option<String> {
        self.policy_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_policy_error(&self, error: Option<String>) {
        *self
            .policy_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = error;
    }
}

/// Registers this replica, then listens and renews until shutdown.
pub async fn run(app: Arc<App>) {
    let revision = app.policy.current().state.revision().to_owned();
    if let Err(err) = app.audit.register_replica(&app.instance, &revision).await {
        tracing::error!(error = %super::error_chain(&err), "cannot register this replica");
    }
    tokio::join!(listen(Arc::clone(&app)), renew_periodically(app));
}

/// Renews this replica's leases and closes expired ones of others, every third of a lease.
async fn renew_periodically(app: Arc<App>) {
    let every = Duration::from_millis(app.config.lease_ms / 3);
    loop {
        // Paused sessions of a dead replica are served here, not closed (`snapshot_replicas`).
        app.adopt_orphaned_pauses().await;
        renew_once(&app).await;
        // What other replicas asked of this one whose notification was lost.
        app.take_waiting_turns().await;
        app.sweep_purged_outputs().await;
        tokio::select! {
            () = app.shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// One renewal: heartbeat and leases, runs closed elsewhere stopped, expired leases closed.
pub async fn renew_once(app: &App) {
    let revision = app.policy.current().state.revision().to_owned();
    let error = app.replicas.policy_error();
    let live = app.live.ids();
    let lease = app.config.lease_ms;
    match app
        .audit
        .renew(&app.instance, (&revision, error.as_deref()), lease, &live)
        .await
    {
        Ok(lost) => {
            for id in lost {
                tracing::warn!(execution_id = %id, "another replica closed this execution (this one was declared dead); stopping it");
                app.live.cancel(&id);
            }
        }
        Err(err) => tracing::warn!(error = %super::error_chain(&err), "lease renewal failed"),
    }
    match app.audit.close_expired(&app.instance, lease).await {
        Ok(closed) if closed.executions + closed.sessions > 0 => tracing::warn!(
            executions = closed.executions,
            sessions = closed.sessions,
            "closed the records of a replica whose leases expired"
        ),
        Ok(_) => {}
        Err(err) => {
            tracing::warn!(error = %super::error_chain(&err), "closing expired leases failed")
        }
    }
}

/// Receives what other replicas send until shutdown (reconnecting after a lost connection).
async fn listen(app: Arc<App>) {
    let own = stream_channel(&app.instance);
    loop {
        let mut listener = match app
            .audit
            .listen(&[WATCH, CANCEL, POLICY, TURN, TURN_NEWS, PURGED, MOVED, &own])
            .await
        {
            Ok(listener) => listener,
            Err(err) => {
                tracing::warn!(error = %super::error_chain(&err), "cannot listen for other replicas; retrying");
                tokio::select! {
                    () = app.shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        loop {
            let received = tokio::select! {
                () = app.shutdown.cancelled() => return,
                received = listener.recv() => received,
            };
            match received {
                Ok(message) => handle(&app, message.channel(), message.payload()),
                Err(err) => {
                    tracing::warn!(error = %err, "replica messages interrupted; listening again");
                    break;
                }
            }
        }
    }
}

fn handle(app: &Arc<App>, channel: &str, payload: &str) {
    let parsed = match channel {
        WATCH => serde_json::from_str(payload).map(|watch| forward(app, watch)),
        CANCEL => serde_json::from_str(payload).map(|cancel: Cancel| {
            if app.live.cancel(&cancel.execution) {
                tracing::info!(execution_id = %cancel.execution, by = %cancel.by, "cancelled for another replica");
            }
        }),
        POLICY => serde_json::from_str(payload).map(|loaded| follow_reload(app, loaded)),
        PURGED => serde_json::from_str(payload).map(|purged| app.purged_elsewhere(purged)),
        MOVED => serde_json::from_str(payload).map(|moved| app.session_moved(moved)),
        TURN | TURN_NEWS => {
            serde_json::from_str(payload).map(|message| app.turn_message(channel, message))
        }
        _ => serde_json::from_str(payload).map(|piece| mirror_piece(app, piece)),
    };
    if let Err(err) = parsed {
        tracing::warn!(channel, error = %err, "unreadable replica message ignored");
    }
}

/// Another replica watches an execution: if it runs here, forward its events from the first.
fn forward(app: &Arc<App>, watch: Watch) {
    let Some(stream) = app.streams.get(&watch.execution) else {
        return;
    };
    let pair = (watch.execution.clone(), watch.watcher.clone());
    if !app.replicas.forwarding().insert(pair.clone()) {
        return;
    }
    let app = Arc::clone(app);
    app.tasks.clone().spawn(async move {
        let channel = stream_channel(&watch.watcher);
        let send = |part: Part| {
            let piece = Piece {
                execution: watch.execution.clone(),
                part,
            };
            let (app, channel) = (Arc::clone(&app), channel.clone());
            async move {
                let payload = serde_json::to_string(&piece).unwrap_or_default();
                app.audit.notify(&channel, &payload).await
            }
        };
        let hello = Part::Hello {
            events: stream.event_count(),
        };
        let mut sent = send(hello).await.is_ok();
        let mut from = 0;
        while sent {
            let Some(batch) = stream.next_batch(from).await else {
                break;
            };
            let first = from;
            from += batch.len();
            let numbered = (first..).zip(batch);
            for part in numbered.flat_map(|(index, event)| parts(index, event)) {
                sent = send(part).await.is_ok();
                if !sent {
                    break;
                }
            }
        }
        app.replicas.forwarding().remove(&pair);
    });
}

/// Event `index` as messages small enough to send.
fn parts(index: usize, event: StreamEvent) -> Vec<Part> {
    let (text, stdout) = match event {
        StreamEvent::Exit(summary) => return vec![Part::Exit { index, summary }],
        StreamEvent::Stdout(text) => (text, true),
        StreamEvent::Stderr(text) => (text, false),
    };
    let engine = base64::engine::general_purpose::STANDARD;
    let pieces = text.len().div_ceil(PIECE).max(1);
    (0..pieces)
        .map(|n| {
            let bytes = &text.as_bytes()[n * PIECE..text.len().min((n + 1) * PIECE)];
            let (b64, more) = (engine.encode(bytes), n + 1 < pieces);
            if stdout {
                Part::Stdout { index, b64, more }
            } else {
                Part::Stderr { index, b64, more }
            }
        })
        .collect()
}

/// A forwarded piece lands in the mirror of its execution.
fn mirror_piece(app: &App, piece: Piece) {
    let Some(mirror) = app.replicas.mirrors().get(&piece.execution).cloned() else {
        return;
    };
    let engine = base64::engine::general_purpose::STANDARD;
    let decoded = |b64: &str| engine.decode(b64).unwrap_or_default();
    match piece.part {
        Part::Hello { events } => {
            mirror.answered.send_replace(Some(events));
        }
        Part::Stdout { index, b64, more } => {
            mirror.piece(index, Channel::Stdout, &decoded(&b64), more);
        }
        Part::Stderr { index, b64, more } => {
            mirror.piece(index, Channel::Stderr, &decoded(&b64), more);
        }
        Part::Exit { index, summary } => {
            mirror.stream.push_at(index, StreamEvent::Exit(summary));
            app.replicas.mirrors().remove(&piece.execution);
        }
    }
}

impl App {
    /// The live events of an execution running on another replica, mirrored here; `None` if
    /// that replica did not answer in time (it ended, or died: the record says).
    pub async fn mirror_of(self: &Arc<Self>, id: &str) -> Option<Arc<Stream>> {
        let (mirror, new) = {
            let mut mirrors = self.replicas.mirrors();
            match mirrors.get(id) {
                Some(mirror) => (mirror.clone(), false),
                None => {
                    let mirror = Mirror {
                        stream: Arc::default(),
                        answered: tokio::sync::watch::channel(None).0,
                        partial: Arc::default(),
                    };
                    mirrors.insert(id.to_owned(), mirror.clone());
                    (mirror, true)
                }
            }
        };
        if new {
            self.tasks.spawn(watch_until_done(
                Arc::clone(self),
                id.to_owned(),
                mirror.clone(),
            ));
        }
        let mut answered = mirror.answered.subscribe();
        let caught_up = async {
            let held = answered.wait_for(Option::is_some).await.ok()?.unwrap_or(0);
            // Until the mirror holds what the running replica held when it answered, so a
            // `Last-Event-ID` issued there is not past this mirror's end.
            mirror.stream.wait_for_events(held).await;
            Some(())
        };
        match tokio::time::timeout(ANSWER_WITHIN, caught_up).await {
            Ok(Some(())) => Some(mirror.stream),
            _ => None,
        }
    }

    /// Asks the replica running `id` to cancel it.
    pub(super) async fn cancel_elsewhere(&self, id: &str) -> Result<(), super::AppError> {
        let cancel = Cancel {
            execution: id.to_owned(),
            by: self.instance.clone(),
        };
        let payload = serde_json::to_string(&cancel).unwrap_or_default();
        self.audit.notify(CANCEL, &payload).await?;
        Ok(())
    }

    /// Tells every other replica that `revision` is loaded here.
    pub async fn announce_policy(&self, revision: &str) {
        self.replicas.set_policy_error(None);
        let loaded = PolicyLoaded {
            revision: revision.to_owned(),
            by: self.instance.clone(),
        };
        let payload = serde_json::to_string(&loaded).unwrap_or_default();
        if let Err(err) = self.audit.notify(POLICY, &payload).await {
            tracing::warn!(error = %super::error_chain(&err), "could not announce the reload to other replicas");
        }
    }

    /// Keeps the collected output files in the database, so every replica can serve them.
    pub(super) async fn share_outputs(&self, id: &str, outputs: &crate::outputs::Collected) {
        if outputs.files.is_empty() {
            return;
        }
        let dir = self.outputs_root.join(id);
        let paths: Vec<String> = outputs.files.iter().map(|file| file.path.clone()).collect();
        let read = tokio::task::spawn_blocking(move || {
            paths
                .into_iter()
                .map(|path| {
                    let mut content = Vec::new();
                    let mut file = crate::outputs::open_collected(&dir, &path)?;
                    std::io::Read::read_to_end(&mut file, &mut content)?;
                    Ok((path, content))
                })
                .collect::<std::io::Result<Vec<_>>>()
        })
        .await;
        let stored = match read {
            Ok(Ok(files)) => self
                .audit
                .store_outputs(id, &files)
                .await
                .map_err(|err| super::error_chain(&err)),
            Ok(Err(err)) => Err(err.to_string()),
            Err(err) => Err(err.to_string()),
        };
        if let Err(error) = stored {
            tracing::warn!(execution_id = %id, %error, "output files not shared with other replicas");
        }
    }
}

/// Asks the running replica to forward until it answers, then watches the record: if it ends
/// without the forwarded end arriving (its replica died and its lease was closed), the mirror
/// ends with the record's end.
async fn watch_until_done(app: Arc<App>, id: String, mirror: Mirror) {
    let ask = Watch {
        execution: id.clone(),
        watcher: app.instance.clone(),
    };
    let payload = serde_json::to_string(&ask).unwrap_or_default();
    let mut ended_seen = 0;
    loop {
        if !mirror.answered() {
            let _ = app.audit.notify(WATCH, &payload).await;
        }
        tokio::select! {
            () = app.shutdown.cancelled() => break,
            () = tokio::time::sleep(ASK_AGAIN) => {}
        }
        if !app.replicas.mirrors().contains_key(&id) {
            return;
        }
        let row = match app.audit.get_execution(&id).await {
            Ok(Some(row)) => row,
            Ok(None) => break,
            Err(_) => continue,
        };
        if row.finished_at.is_some() {
            ended_seen += 1;
            // The forwarded end follows the stored record closely; give it a moment.
            if ended_seen > 4 || !mirror.answered() {
                mirror.stream.close(super::executions::exit_summary(&row));
                break;
            }
        }
    }
    app.replicas.mirrors().remove(&id);
}

/// Another replica reloaded: load the same revision here, from its files as that replica
/// stored them (not from this replica's own `policy_dir`), or say why not (`policy_error`, in
/// `/readyz`; logged once per announcement).
fn follow_reload(app: &Arc<App>, loaded: PolicyLoaded) {
    if loaded.by == app.instance {
        return;
    }
    let app = Arc::clone(app);
    app.tasks.clone().spawn(async move {
        let followed = app.follow_revision(&loaded.revision, &loaded.by).await;
        let error = followed.err().map(|why| {
            format!(
                "{} announced revision {}, which this replica could not load ({why}); it runs {}",
                loaded.by,
                loaded.revision,
                app.policy.current().state.revision()
            )
        });
        if let Some(error) = &error {
            tracing::warn!(%error, "the policy revision of another replica is not loaded here");
        }
        app.replicas.set_policy_error(error);
        renew_once(&app).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_big_event_is_cut_into_pieces_of_one_index_and_only_the_last_ends_it() {
        let text = "é".repeat(PIECE); // 2 * PIECE bytes: cut inside characters too
        let pieces = parts(7, StreamEvent::Stderr(text.clone()));
        assert_eq!(pieces.len(), 2);
        let mirror = Mirror {
            stream: Arc::default(),
            answered: tokio::sync::watch::channel(None).0,
            partial: Arc::default(),
        };
        mirror.stream.push_at(0, StreamEvent::Stdout(String::new()));
        for n in 1..7 {
            mirror.stream.push_at(n, StreamEvent::Stdout(String::new()));
        }
        let engine = base64::engine::general_purpose::STANDARD;
        for piece in pieces {
            let Part::Stderr { index, b64, more } = piece else {
                panic!("{piece:?}");
            };
            assert_eq!(index, 7);
            mirror.piece(index, Channel::Stderr, &engine.decode(b64).unwrap(), more);
        }
        assert_eq!(mirror.stream.event_count(), 8);
        assert_eq!(mirror.stream.text_so_far().1, text);
        assert!(matches!(
            parts(3, StreamEvent::Stdout(String::new()))[..],
            [Part::Stdout {
                index: 3,
                more: false,
                ..
            }]
        ));
    }
}
