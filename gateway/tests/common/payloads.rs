//! Reading what executions produced through the API: output downloads and the event stream.

use std::time::Duration;

use serde_json::Value;

use super::TestGateway;

/// One server-sent event: its name and its JSON data.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub name: String,
    pub data: Value,
    /// The event's `id:` (its position in the stream, from 1).
    pub id: Option<u64>,
}

impl TestGateway {
    /// `GET /v1/executions/{id}/outputs/{path}`: status, body and the sha256 header.
    pub async fn download(
        &self,
        key: &str,
        id: &str,
        path: &str,
    ) -> (u16, Vec<u8>, Option<String>) {
        let response = self
            .http
            .get(format!("{}/v1/executions/{id}/outputs/{path}", self.url))
            .bearer_auth(key)
            .send()
            .await
            .expect("request");
        let status = response.status().as_u16();
        let sha = response
            .headers()
            .get("x-sandgate-sha256")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (status, response.bytes().await.unwrap().to_vec(), sha)
    }

    /// Opens `GET /v1/executions/{id}/events`; the reader yields events as they arrive.
    pub async fn events(&self, key: &str, id: &str) -> SseReader {
        self.events_after(key, id, None).await
    }

    /// Like [`TestGateway::events`], resuming after event `last` (`Last-Event-ID`).
    pub async fn events_after(&self, key: &str, id: &str, last: Option<u64>) -> SseReader {
        let mut request = self
            .http
            .get(format!("{}/v1/executions/{id}/events", self.url))
            .bearer_auth(key);
        if let Some(last) = last {
            request = request.header("last-event-id", last.to_string());
        }
        let response = request.send().await.expect("request");
        assert_eq!(response.status().as_u16(), 200, "events of {id}");
        assert!(response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream")));
        SseReader {
            response,
            buffer: Vec::new(),
        }
    }
}

pub struct SseReader {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl SseReader {
    /// The next event (keep-alive comments skipped); `None` at the end of the stream.
    pub async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let block = String::from_utf8(block).expect("events are UTF-8");
                let mut name = String::from("message");
                let mut data = String::new();
                let mut id = None;
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("id:") {
                        id = Some(value.trim().parse().expect("numeric event id"));
                    } else if let Some(value) = line.strip_prefix("event:") {
                        name = value.trim().to_owned();
                    } else if let Some(value) = line.strip_prefix("data:") {
                        data.push_str(value.strip_prefix(' ').unwrap_or(value));
                    }
                }
                if data.is_empty() {
                    continue;
                }
                let data = serde_json::from_str(&data).expect("event data is JSON");
                return Some(SseEvent { name, data, id });
            }
            let chunk = tokio::time::timeout(Duration::from_secs(120), self.response.chunk())
                .await
                .expect("event stream stalled")
                .expect("event stream");
            match chunk {
                Some(bytes) => self.buffer.extend_from_slice(&bytes),
                None => return None,
            }
        }
    }

    /// Every remaining event.
    pub async fn collect(mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }
}

/// stdout and stderr as the events carried them, concatenated.
pub fn streamed_text(events: &[SseEvent], name: &str) -> String {
    events
        .iter()
        .filter(|e| e.name == name)
        .map(|e| e.data["text"].as_str().expect("text").to_owned())
        .collect()
}
