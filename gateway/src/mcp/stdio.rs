//! `sandgate mcp`: the MCP stdio transport. One JSON-RPC message per line on stdin, one answer
//! per line on stdout; logs go to stderr. Ends at end of input.

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use super::protocol::{self, RpcError, INVALID_REQUEST};
use super::{Runner, MAX_MESSAGE_BYTES};

/// Serves `runner` on `input`/`output` until `input` ends.
pub async fn serve<R, I, O>(runner: &R, input: I, mut output: O) -> std::io::Result<()>
where
    R: Runner,
    I: tokio::io::AsyncRead + Unpin,
    O: AsyncWrite + Unpin,
{
    let mut lines = BufReader::new(input);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut lines)
            .take(MAX_MESSAGE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .await?;
        if read == 0 {
            return Ok(());
        }
        let answer = if line.len() > MAX_MESSAGE_BYTES {
            skip_rest_of_line(&mut lines).await?;
            Some(protocol::error_response(
                serde_json::Value::Null,
                &RpcError::new(
                    INVALID_REQUEST,
                    format!("message over {MAX_MESSAGE_BYTES} bytes"),
                ),
            ))
        } else if line.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            protocol::handle_bytes(runner, &line).await
        };
        if let Some(answer) = answer {
            let mut text = answer.to_string();
            text.push('\n');
            output.write_all(text.as_bytes()).await?;
            output.flush().await?;
        }
    }
}

async fn skip_rest_of_line<I: tokio::io::AsyncBufRead + Unpin>(
    input: &mut I,
) -> std::io::Result<()> {
    let mut sink = Vec::new();
    loop {
        sink.clear();
        let read = input.take(64 * 1024).read_until(b'\n', &mut sink).await?;
        if read == 0 || sink.ends_with(b"\n") {
            return Ok(());
        }
    }
}
