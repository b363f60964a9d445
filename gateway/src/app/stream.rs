//! Live output of running executions, for `GET /v1/executions/{id}/events`.
//!
//! The runtime hands every byte it keeps (the same capped bytes the final record stores) to the
//! execution's [`Stream`]; subscribers replay what is already there and then follow. Memory per
//! execution is bounded by its output cap. Once the record is complete the stream is dropped and
//! late subscribers replay the stored record instead, so both views carry the same bytes.
//!
//! Output is coalesced: a chunk joins the last event while that event is of the same channel,
//! under [`MAX_EVENT_BYTES`] and not yet handed to any subscriber; a subscriber woken by new
//! output waits [`COALESCE`] before reading, so a traceback written a few bytes at a time
//! arrives as one event. An event never changes once a subscriber has it, so its position is a
//! stable id (`id:` in SSE, resumed with `Last-Event-ID`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use crate::runtime::{Channel, OutputSink};

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    Stdout(String),
    Stderr(String),
    /// The end: the final record's status and exit code.
    Exit(serde_json::Value),
}

/// Most output events one stream holds: a program writing one byte at a time, alternating
/// stdout and stderr, would otherwise cost an allocation per byte. Past it the live stream
/// stops carrying output (the record still has all of it) and its `exit` event says so.
const MAX_EVENTS: usize = 65_536;
/// Most events handed to a subscriber at once.
const MAX_BATCH: usize = 1024;
/// Largest output event that more output may join.
pub const MAX_EVENT_BYTES: usize = 16 * 1024;
/// How long a subscriber woken by new output waits for more to join it.
pub const COALESCE: std::time::Duration = std::time::Duration::from_millis(10);

impl StreamEvent {
    /// Kept output as text (invalid UTF-8 as U+FFFD, as the record decodes it).
    fn output(channel: Channel, bytes: &[u8]) -> StreamEvent {
        let text = String::from_utf8_lossy(bytes).into_owned();
        match channel {
            Channel::Stdout => StreamEvent::Stdout(text),
            Channel::Stderr => StreamEvent::Stderr(text),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    events: Vec<StreamEvent>,
    /// Output was left out of the stream at [`MAX_EVENTS`].
    lossy: bool,
    /// Bytes of an incomplete UTF-8 sequence held back, per stream (stdout, stderr).
    pending: [Vec<u8>; 2],
    /// Events before this index have been handed to a subscriber and never change.
    published: usize,
    closed: bool,
}

impl State {
    /// Adds output, joining the last event when it is unpublished, of the same channel and
    /// small enough.
    fn push_output(&mut self, channel: Channel, text: String) {
        let unpublished = self.events.len() > self.published;
        if let (true, Some(last)) = (unpublished, self.events.last_mut()) {
            let joined = match (channel, last) {
                (Channel::Stdout, StreamEvent::Stdout(last))
                | (Channel::Stderr, StreamEvent::Stderr(last)) => {
                    (last.len() + text.len() <= MAX_EVENT_BYTES).then(|| last.push_str(&text))
                }
                _ => None,
            };
            if joined.is_some() {
                return;
            }
        }
        self.events.push(match channel {
            Channel::Stdout => StreamEvent::Stdout(text),
            Channel::Stderr => StreamEvent::Stderr(text),
        });
    }
}

/// The events of one execution so far.
#[derive(Debug)]
pub struct Stream {
    state: Mutex<State>,
    /// Bumped on every change, so subscribers can wait.
    changed: watch::Sender<u64>,
}

impl Default for Stream {
    fn default() -> Stream {
        Stream {
            state: Mutex::default(),
            changed: watch::channel(0).0,
        }
    }
}

impl Stream {
    /// Appends kept output. Text is emitted on UTF-8 boundaries, so the concatenated events
    /// decode to exactly what the final record holds.
    pub fn append(&self, channel: Channel, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut state = self.lock();
        if state.closed || state.lossy {
            return;
        }
        if state.events.len() >= MAX_EVENTS {
            state.lossy = true;
            return;
        }
        let pending = &mut state.pending[channel as usize];
        pending.extend_from_slice(bytes);
        let cut = complete_prefix(pending);
        if cut == 0 {
            return;
        }
        let text = String::from_utf8_lossy(&pending[..cut]).into_owned();
        pending.drain(..cut);
        state.push_output(channel, text);
        drop(state);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Ends the stream with the final record's summary (held-back bytes are flushed first).
    pub fn close(&self, mut exit: serde_json::Value) {
        let mut state = self.lock();
        if state.closed {
            return;
        }
        if state.lossy {
            exit["stream_truncated"] = serde_json::Value::Bool(true);
            state.pending = Default::default();
        }
        for channel in [Channel::Stdout, Channel::Stderr] {
            let rest = std::mem::take(&mut state.pending[channel as usize]);
            if !rest.is_empty() {
                state.events.push(StreamEvent::output(channel, &rest));
            }
        }
        state.events.push(StreamEvent::Exit(exit));
        state.closed = true;
        drop(state);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Events from `from` on; waits for more unless the stream has ended. `None`: ended and
    /// nothing left.
    pub async fn next_batch(&self, from: usize) -> Option<Vec<StreamEvent>> {
        let mut changes = self.changed.subscribe();
        loop {
            {
                let mut state = self.lock();
                if from < state.events.len() {
                    let to = state.events.len().min(from + MAX_BATCH);
                    state.published = state.published.max(to);
                    return Some(state.events[from..to].to_vec());
                }
                if state.closed {
                    return None;
                }
            }
            if changes.changed().await.is_err() {
                return None;
            }
            // Let output that follows at once join this event (the end is not held back).
            if !self.lock().closed {
                tokio::time::sleep(COALESCE).await;
            }
        }
    }

    /// How many events there are so far (a `Last-Event-ID` past it resumes at the end).
    pub fn event_count(&self) -> usize {
        self.lock().events.len()
    }

    /// Appends an event exactly as another replica's stream holds it at `index` (a mirror
    /// keeps the running replica's positions, so its SSE ids are the same); the `exit` event
    /// ends it. An output event already held is ignored; `false`: an event before `index` is
    /// missing (the mirror then stops carrying output, as at its bound, and its `exit` says
    /// so; said once).
    pub fn push_at(&self, index: usize, event: StreamEvent) -> bool {
        let output = match event {
            StreamEvent::Exit(summary) => {
                self.close(summary);
                return true;
            }
            output => output,
        };
        let mut state = self.lock();
        if state.closed || state.lossy || index < state.events.len() {
            return true;
        }
        if index > state.events.len() {
            state.lossy = true;
            return false;
        }
        state.events.push(output);
        state.published = state.events.len();
        drop(state);
        self.changed.send_modify(|n| *n += 1);
        true
    }

    /// Waits until the stream holds `count` events or has ended.
    pub async fn wait_for_events(&self, count: usize) {
        let mut changes = self.changed.subscribe();
        loop {
            {
                let state = self.lock();
                if state.events.len() >= count || state.closed {
                    return;
                }
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// How the events split the output, in order (`[["stdout", bytes], ...]`, the tails
    /// `close` will flush included), or `None` when the stream dropped output at its bound.
    pub fn layout(&self) -> Option<serde_json::Value> {
        let state = self.lock();
        if state.lossy {
            return None;
        }
        let mut runs: Vec<serde_json::Value> = state
            .events
            .iter()
            .filter_map(|event| match event {
                StreamEvent::Stdout(text) => Some(serde_json::json!(["stdout", text.len()])),
                StreamEvent::Stderr(text) => Some(serde_json::json!(["stderr", text.len()])),
                StreamEvent::Exit(_) => None,
            })
            .collect();
        for (name, rest) in ["stdout", "stderr"].iter().zip(&state.pending) {
            if !rest.is_empty() {
                let text = String::from_utf8_lossy(rest);
                runs.push(serde_json::json!([name, text.len()]));
            }
        }
        Some(serde_json::Value::Array(runs))
    }

    /// The output so far, per channel, as the record will hold it (for `GET` while running).
    pub fn text_so_far(&self) -> (String, String) {
        let state = self.lock();
        let (mut stdout, mut stderr) = (String::new(), String::new());
        for event in &state.events {
            match event {
                StreamEvent::Stdout(text) => stdout.push_str(text),
                StreamEvent::Stderr(text) => stderr.push_str(text),
                StreamEvent::Exit(_) => {}
            }
        }
        (stdout, stderr)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl OutputSink for Stream {
    fn push(&self, channel: Channel, bytes: &[u8]) {
        self.append(channel, bytes);
    }
}

/// Length of the longest prefix that does not end inside a UTF-8 sequence. Invalid bytes count
/// as complete (they decode to U+FFFD either way).
fn complete_prefix(bytes: &[u8]) -> usize {
    let len = bytes.len();
    // A sequence is at most 4 bytes: look back at most 3 for its lead byte.
    for back in 1..=len.min(3) {
        let byte = bytes[len - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // continuation byte: keep looking for the lead
        }
        let needed = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if needed > back { len - back } else { len };
    }
    len
}

/// Streams of the executions this process runs.
#[derive(Debug, Default)]
pub struct Streams {
    inner: Mutex<HashMap<String, Arc<Stream>>>,
}

impl Streams {
    pub fn open(&self, id: &str) -> Arc<Stream> {
        let stream = Arc::new(Stream::default());
        self.lock().insert(id.to_owned(), Arc::clone(&stream));
        stream
    }

    pub fn get(&self, id: &str) -> Option<Arc<Stream>> {
        self.lock().get(id).cloned()
    }

    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Stream>>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_split_on_boundaries_only() {
        let stream = Stream::default();
        let text = "héllo → 世界";
        for byte in text.as_bytes() {
            stream.append(Channel::Stdout, std::slice::from_ref(byte));
        }
        stream.close(serde_json::json!({}));
        let state = stream.lock();
        let joined: String = state
            .events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::Stdout(s) => Some(s.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(joined, text);
    }

    #[test]
    fn incomplete_tail_is_flushed_at_close_like_lossy_decoding() {
        let stream = Stream::default();
        stream.append(Channel::Stderr, &[b'a', 0xE2, 0x86]);
        stream.close(serde_json::json!({}));
        let state = stream.lock();
        let joined: String = state
            .events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::Stderr(s) => Some(s.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(joined, String::from_utf8_lossy(&[b'a', 0xE2, 0x86]));
    }

    #[test]
    fn event_count_is_bounded_and_the_end_says_so() {
        let stream = Stream::default();
        for i in 0..(MAX_EVENTS + 100) {
            let channel = if i % 2 == 0 {
                Channel::Stdout
            } else {
                Channel::Stderr
            };
            stream.append(channel, b"x");
        }
        stream.close(serde_json::json!({"status": "succeeded"}));
        let state = stream.lock();
        assert_eq!(state.events.len(), MAX_EVENTS + 1);
        match state.events.last() {
            Some(StreamEvent::Exit(exit)) => assert_eq!(exit["stream_truncated"], true),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn small_writes_coalesce_until_published_or_full_and_published_events_never_change() {
        let stream = Stream::default();
        for _ in 0..200 {
            stream.append(Channel::Stderr, b"ab");
        }
        stream.append(Channel::Stdout, b"out");
        stream.append(Channel::Stdout, b"put");
        let first = stream.next_batch(0).await.unwrap();
        assert_eq!(
            first,
            [
                StreamEvent::Stderr("ab".repeat(200)),
                StreamEvent::Stdout("output".into())
            ]
        );
        stream.append(Channel::Stdout, b"!");
        let second = stream.next_batch(2).await.unwrap();
        assert_eq!(
            second,
            [StreamEvent::Stdout("!".into())],
            "published: not joined"
        );
        assert_eq!(stream.next_batch(0).await.unwrap()[..2], first[..]);

        let big = Stream::default();
        big.append(Channel::Stdout, &vec![b'x'; MAX_EVENT_BYTES]);
        big.append(Channel::Stdout, b"y");
        assert_eq!(big.event_count(), 2, "an event is at most MAX_EVENT_BYTES");
        assert_eq!(big.text_so_far().0.len(), MAX_EVENT_BYTES + 1);
    }

    #[tokio::test]
    async fn a_mirror_holds_events_at_the_positions_it_is_given_and_says_when_one_is_missing() {
        let mirror = Stream::default();
        assert!(mirror.push_at(0, StreamEvent::Stdout("a".into())));
        assert!(mirror.push_at(1, StreamEvent::Stdout("b".into())));
        assert!(
            mirror.push_at(1, StreamEvent::Stdout("b".into())),
            "held: ignored"
        );
        assert_eq!(
            mirror.next_batch(0).await.unwrap(),
            [
                StreamEvent::Stdout("a".into()),
                StreamEvent::Stdout("b".into())
            ],
            "forwarded events are never joined"
        );
        assert!(
            !mirror.push_at(3, StreamEvent::Stdout("d".into())),
            "2 is missing"
        );
        assert!(
            mirror.push_at(4, StreamEvent::Stdout("e".into())),
            "said once"
        );
        mirror.push_at(
            5,
            StreamEvent::Exit(serde_json::json!({"status": "succeeded"})),
        );
        let rest = mirror.next_batch(2).await.unwrap();
        match &rest[..] {
            [StreamEvent::Exit(exit)] => assert_eq!(exit["stream_truncated"], true),
            other => panic!("{other:?}"),
        }
        mirror.wait_for_events(10).await; // ended: returns
    }

    #[tokio::test]
    async fn subscribers_replay_then_follow_then_end() {
        let stream = Arc::new(Stream::default());
        stream.append(Channel::Stdout, b"one\n");
        let first = stream.next_batch(0).await.unwrap();
        assert_eq!(first, [StreamEvent::Stdout("one\n".into())]);
        let follower = {
            let stream = Arc::clone(&stream);
            tokio::spawn(async move { stream.next_batch(1).await })
        };
        tokio::task::yield_now().await;
        stream.append(Channel::Stdout, b"two\n");
        assert_eq!(
            follower.await.unwrap().unwrap(),
            [StreamEvent::Stdout("two\n".into())]
        );
        stream.close(serde_json::json!({"status": "succeeded"}));
        assert!(matches!(
            stream.next_batch(2).await.unwrap()[..],
            [StreamEvent::Exit(_)]
        ));
        assert!(stream.next_batch(3).await.is_none());
    }
}
