//! A session's file operations (`sandbox_protocol`'s `files` module): one line on the held
//! stdin, the init's answer taken out of stderr. Only between turns: the caller holds the
//! session, so no turn pumps the output meanwhile. What else the sandbox prints meanwhile
//! belongs to no turn and is dropped, as after a report request.

use std::time::Duration;

use bollard::container::LogOutput;
use futures_util::StreamExt;
use sandbox_protocol::{FileAnswer, FileAnswerTaker, FileLine, FileRequest};
use tokio::io::AsyncWriteExt;

use super::run::DockerSandbox;
use crate::runtime::RuntimeError;

/// How long the init has to answer one file operation (a 16 MiB read or a large removal
/// under gVisor takes well under this).
const ANSWER_WAIT: Duration = Duration::from_secs(60);

pub(super) async fn file_op(
    sandbox: &mut DockerSandbox,
    request: FileRequest,
) -> Result<FileAnswer, RuntimeError> {
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    let line = FileLine {
        file: request,
        exit_nonce: nonce.clone(),
    };
    let mut bytes = serde_json::to_vec(&line).map_err(|err| failed("encode", &err))?;
    drop(line);
    bytes.push(b'\n');
    let written = async {
        sandbox.input.write_all(&bytes).await?;
        sandbox.input.flush().await
    };
    written
        .await
        .map_err(|err| failed("hand the file operation to the session", &err))?;
    drop(bytes);
    let mut taker = FileAnswerTaker::new(&nonce);
    let answer = async {
        while let Some(frame) = sandbox.output.next().await {
            match frame {
                Ok(LogOutput::StdErr { message }) => {
                    if let Some(answer) = taker.feed(&message) {
                        return answer.map_err(|err| failed("read the answer", &err));
                    }
                }
                Ok(_) => {}
                Err(err) => return Err(failed("read the answer", &err)),
            }
        }
        Err(RuntimeError::Unavailable(
            "the session's sandbox ended".into(),
        ))
    };
    match tokio::time::timeout(ANSWER_WAIT, answer).await {
        Ok(answer) => answer,
        Err(_) => Err(RuntimeError::Timeout {
            operation: "a file operation",
            seconds: ANSWER_WAIT.as_secs(),
        }),
    }
}

fn failed(operation: &'static str, err: &dyn std::fmt::Display) -> RuntimeError {
    RuntimeError::Docker {
        operation,
        message: err.to_string(),
    }
}
