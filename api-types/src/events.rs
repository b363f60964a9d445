//! The Server-Sent Events of `GET /v1/executions/{id}/events`: `stdout` and `stderr` carry an
//! [`OutputEvent`] as the output arrives, the last event is `exit` with an [`ExitEvent`] (the
//! final record's status, as `GET /v1/executions/{id}` then shows it).

use serde::{Deserialize, Serialize};

use crate::execution::OutputFile;
use crate::status::ExecutionStatus;

/// The `event:` names of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StreamEventName {
    Stdout,
    Stderr,
    Exit,
}

crate::text_forms::text_forms!(StreamEventName {
    Stdout => "stdout",
    Stderr => "stderr",
    Exit => "exit",
});

/// The data of a `stdout` or `stderr` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutputEvent {
    pub text: String,
}

/// The data of the `exit` event: how the execution ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExitEvent {
    pub status: ExecutionStatus,
    pub exit_code: Option<i32>,
    pub duration_ms: Option<i64>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub outputs: Vec<OutputFile>,
    pub outputs_truncated: bool,
    /// The live stream left output out (too many events); the record has all of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream_truncated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_event_round_trips() {
        let text = concat!(
            r#"{"status":"failed","exit_code":1,"duration_ms":30,"stdout_truncated":false,"#,
            r#""stderr_truncated":true,"outputs":[],"outputs_truncated":false}"#
        );
        let exit: ExitEvent = serde_json::from_str(text).unwrap();
        assert_eq!(exit.status, ExecutionStatus::Failed);
        assert!(!exit.stream_truncated);
        assert_eq!(serde_json::to_string(&exit).unwrap(), text);
        let lossy = ExitEvent {
            stream_truncated: true,
            ..exit
        };
        assert_eq!(
            serde_json::to_value(&lossy).unwrap()["stream_truncated"],
            true
        );
    }

    #[test]
    fn output_events_and_names() {
        let event: OutputEvent = serde_json::from_str(r#"{"text":"hi\n"}"#).unwrap();
        assert_eq!(event.text, "hi\n");
        crate::text_forms::assert_serde_matches(StreamEventName::ALL, |name| name.as_str());
    }
}
