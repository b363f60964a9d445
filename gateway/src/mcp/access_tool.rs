//! The MCP tool `request_access`: an agent asks for what one of its executions was refused
//! (`POST /v1/executions/{id}/access-request`). It opens a policy proposal for a human reviewer
//! from the bundle's suggestion and grants nothing by itself.

use serde_json::{json, Map, Value};

use super::protocol::RpcError;
use super::tools::{only, refused, required_text};
use super::Runner;

pub const NAME: &str = "request_access";
const ARGUMENTS: [&str; 2] = ["execution_id", "justification"];

/// Its `tools/list` entry.
pub fn tool() -> Value {
    json!({
        "name": NAME,
        "title": "Ask a human reviewer for access",
        "description": "After run_code was denied or held for review, asks sandgate's reviewers \
                        to change the policy so that such a request is allowed. It opens a \
                        proposal (the policy's own suggestion for the refusal) with your \
                        justification; it changes nothing until a reviewer approves it.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "execution_id": {"type": "string", "description": "the denied or held execution (ex_...)"},
                "justification": {"type": "string", "description": "why the task needs it"},
            },
            "required": ["execution_id", "justification"],
            "additionalProperties": false,
        },
    })
}

/// `tools/call` of [`NAME`].
pub async fn call<R: Runner>(
    runner: &R,
    arguments: &Map<String, Value>,
) -> Result<Value, RpcError> {
    only(arguments, NAME, &ARGUMENTS)?;
    let id = required_text(arguments, "execution_id")?;
    let justification = required_text(arguments, "justification")?;
    Ok(match runner.request_access(id, justification).await {
        Ok(answer) => {
            let text = format!(
                "proposal {} opened for a human reviewer; nothing changes until it is approved",
                answer.proposal_id
            );
            json!({
                "content": [{"type": "text", "text": text}],
                "structuredContent": answer,
                "isError": false,
            })
        }
        Err(refusal) => refused(&refusal),
    })
}
