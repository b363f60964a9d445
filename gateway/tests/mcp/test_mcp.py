"""sandgate's MCP server, driven by the official MCP Python SDK as a real client, over both
transports: `sandgate mcp` (stdio) and `POST /mcp` (streamable HTTP). Started by
gateway/tests/e2e/mcp.rs, which passes the live gateway's URL, an agent key and the binary."""

import os

import httpx
import pytest
from mcp import ClientSession, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


URL = os.environ.get("SANDGATE_URL", "")
KEY = os.environ.get("SANDGATE_KEY", "")
BIN = os.environ.get("SANDGATE_BIN", "")
# An agent of `classroom`, which the shipped policy does not let open sessions.
CLASSROOM_KEY = os.environ.get("SANDGATE_CLASSROOM_KEY", "")


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _require_env():
    if not (URL and KEY and BIN and CLASSROOM_KEY):
        pytest.fail("SANDGATE_URL, SANDGATE_KEY, SANDGATE_CLASSROOM_KEY and SANDGATE_BIN are unset: "
                    "run `cargo test -p gateway --test e2e -- mcp::`")


async def _exercise(session: ClientSession, with_image: bool) -> None:
    init = await session.initialize()
    assert init.server_info.name == "sandgate"
    tools = await session.list_tools()
    assert [tool.name for tool in tools.tools] == ["run_code", "open_session", "run_in_session", "close_session", "request_access"]
    assert "code" in tools.tools[0].input_schema["required"]
    assert tools.tools[2].input_schema["required"] == ["session_id", "code"]

    ran = await session.call_tool("run_code", {"code": "import sys\nprint(6 * 7)\nprint('w', file=sys.stderr)"})
    assert not ran.is_error, ran
    text = ran.content[0].text
    assert "status: succeeded" in text and "42" in text and "--- stderr ---\nw" in text
    assert ran.structured_content["stdout"] == "42\n"

    denied = await session.call_tool("run_code", {"code": "x", "language": "cobol"})
    assert denied.is_error
    assert "policy_denied" in denied.content[0].text
    reasons = denied.structured_content["error"]["reasons"]
    assert [r["code"] for r in reasons] == ["language.not_allowed"]
    await _request_access(session, denied.structured_content["error"]["execution_id"])

    with pytest.raises(MCPError) as malformed:
        await session.call_tool("run_code", {"language": "python"})
    assert malformed.value.error.code == -32602
    with pytest.raises(MCPError):
        await session.call_tool("no_such_tool", {})

    await _session_tools(session)

    if with_image:
        code = (
            "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3])\nplt.savefig('/output/line.png')\n"
        )
        drawn = await session.call_tool("run_code", {"code": code})
        assert not drawn.is_error, drawn
        images = [c for c in drawn.content if c.type == "image"]
        assert len(images) == 1 and images[0].mime_type == "image/png"


async def _request_access(session: ClientSession, execution_id: str) -> None:
    """request_access answers the same over both transports: the proposal's id and status only
    (the patch is for reviewers), as structured content and in its text."""
    asked = await session.call_tool("request_access", {"execution_id": execution_id,
                                                       "justification": "the task is in COBOL"})
    assert not asked.is_error, asked
    answer = asked.structured_content
    assert sorted(answer) == ["proposal_id", "status"], answer
    assert answer["status"] == "open" and answer["proposal_id"].startswith("pp_")
    assert answer["proposal_id"] in asked.content[0].text
    with pytest.raises(MCPError) as malformed:
        await session.call_tool("request_access", {"execution_id": execution_id})
    assert malformed.value.error.code == -32602
    unknown = await session.call_tool("request_access", {"execution_id": "ex_nonesuch", "justification": "j"})
    assert unknown.is_error and unknown.structured_content["error"]["code"] == "not_found"


async def _session_tools(session: ClientSession) -> None:
    opened = await session.call_tool("open_session", {"language": "python", "idle_timeout_s": 120})
    assert not opened.is_error, opened
    session_id = opened.structured_content["session_id"]
    assert session_id.startswith("ss_") and session_id in opened.content[0].text
    assert opened.structured_content["status"] == "ready"

    first = await session.call_tool("run_in_session", {"session_id": session_id, "code": "x = 41"})
    assert not first.is_error, first
    second = await session.call_tool("run_in_session", {"session_id": session_id, "code": "x + 1"})
    assert second.structured_content["result"] == "42", second
    assert second.structured_content["session_id"] == session_id
    assert "result: 42" in second.content[0].text

    with pytest.raises(MCPError) as malformed:
        await session.call_tool("run_in_session", {"code": "x"})
    assert malformed.value.error.code == -32602
    with pytest.raises(MCPError) as malformed:
        await session.call_tool("open_session", {"idle_timeout_s": "soon"})
    assert malformed.value.error.code == -32602

    unknown = await session.call_tool("run_in_session", {"session_id": "ss_nonesuch", "code": "1"})
    assert unknown.is_error and unknown.structured_content["error"]["code"] == "not_found"
    refused = await session.call_tool("open_session", {"language": "cobol"})
    assert refused.is_error and refused.structured_content["error"]["code"] == "invalid_request"
    assert "sessions run python or bash" in refused.content[0].text

    closed = await session.call_tool("close_session", {"session_id": session_id})
    assert not closed.is_error, closed
    assert closed.structured_content["status"] == "closed"
    assert closed.structured_content["closed_reason"] == "deleted"
    after = await session.call_tool("run_in_session", {"session_id": session_id, "code": "x"})
    assert after.is_error and after.structured_content["error"]["code"] == "conflict"


@pytest.mark.anyio
async def test_stdio_transport():
    _require_env()
    server = StdioServerParameters(command=BIN, args=["mcp", "--url", URL, "--key", KEY])
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await _exercise(session, with_image=False)


@pytest.mark.anyio
async def test_streamable_http_transport():
    _require_env()
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {KEY}"})
    async with http, streamable_http_client(f"{URL}/mcp", http_client=http) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await _exercise(session, with_image=True)


def test_streamable_http_needs_an_agent_key():
    _require_env()
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    anonymous = httpx.post(f"{URL}/mcp", json=message)
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "unauthenticated"


def test_malformed_messages_get_json_rpc_errors():
    _require_env()
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    for body, code in [(b"{not json", -32700), (b"[]", -32600), (b'{"jsonrpc": "2.0", "id": 7, "method": "x/y"}', -32601)]:
        answer = httpx.post(f"{URL}/mcp", content=body, headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.json()["error"]["code"] == code, answer.text
    notification = httpx.post(f"{URL}/mcp", content=b'{"jsonrpc": "2.0", "method": "notifications/initialized"}', headers=headers)
    assert notification.status_code == 202 and notification.content == b""


@pytest.mark.anyio
async def test_a_session_the_policy_refuses_is_a_tool_error_with_its_reasons():
    _require_env()
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {CLASSROOM_KEY}"})
    async with http, streamable_http_client(f"{URL}/mcp", http_client=http) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            refused = await session.call_tool("open_session", {"language": "python"})
    assert refused.is_error
    assert "policy_denied" in refused.content[0].text
    assert [r["code"] for r in refused.structured_content["error"]["reasons"]] == ["session.not_allowed"]
