"""The SDK against a live gateway: runs, files in and out, streams, errors as exceptions."""

import hashlib

import httpx
import pytest

import sandgate
from sandgate import Client


def test_hello_world(client):
    execution = client.run("print(1 + 1)")
    assert execution.status == "succeeded"
    assert execution.stdout == "2\n"
    assert execution.exit_code == 0
    assert execution.decision is not None and execution.decision.allow


def test_a_failing_program_is_a_record_not_an_exception(client):
    execution = client.run("echo oops >&2; exit 3", language="bash")
    assert execution.status == "failed"
    assert execution.exit_code == 3
    assert execution.stderr == "oops\n"


def test_files_in_and_outputs_out(client, tmp_path):
    source = tmp_path / "numbers.txt"
    source.write_bytes(b"4\n5\n")
    code = (
        "total = sum(int(x) for x in open('numbers.txt')) + len(open('data.csv').read())\n"
        "open('/output/total.txt', 'w').write(str(total))\n"
    )
    execution = client.run(code, files={"data.csv": b"a,b\n", "numbers.txt": str(source)})
    assert execution.status == "succeeded", execution.stderr
    [output] = execution.outputs
    assert output.path == "total.txt"
    data = execution.download("total.txt", dest=tmp_path / "total.txt")
    assert data == b"13"
    assert (tmp_path / "total.txt").read_bytes() == b"13"
    assert output.sha256 == hashlib.sha256(b"13").hexdigest()


def test_stream_yields_output_as_it_happens_then_exit(client):
    code = "import sys, time\nprint('one', flush=True)\ntime.sleep(0.5)\nprint('two', file=sys.stderr)\n"
    events = list(client.stream(code))
    stdout = "".join(e.text for e in events if e.kind == "stdout")
    stderr = "".join(e.text for e in events if e.kind == "stderr")
    assert stdout == "one\n"
    assert stderr == "two\n"
    assert events[-1].kind == "exit"
    assert events[-1].status == "succeeded"
    assert events[-1].exit_code == 0


def test_run_without_waiting_then_wait_and_cancel(client):
    execution = client.run("import time; time.sleep(60)", wait=False)
    assert execution.status in ("queued", "running")
    execution.cancel()
    assert execution.status == "cancelled"
    with pytest.raises(sandgate.Conflict):
        execution.cancel()


def test_a_denial_is_policy_denied_with_the_reasons(client):
    with pytest.raises(sandgate.PolicyDenied) as denied:
        client.run("x", language="cobol")
    assert denied.value.status == 403
    assert [r.code for r in denied.value.reasons] == ["language.not_allowed"]
    assert denied.value.execution_id.startswith("ex_")
    # The denial is a record too, readable with the same key.
    assert client.get(denied.value.execution_id).status == "denied"


def test_a_wrong_key_is_unauthenticated(url):
    with Client(url, "sg_wrong") as client, pytest.raises(sandgate.Unauthenticated):
        client.run("print(1)")


def test_a_bad_request_is_invalid_request_with_the_gateways_message(client):
    with pytest.raises(sandgate.InvalidRequest) as invalid:
        client.run("print(1)", files={"../escape": b"x"})
    assert invalid.value.message


def test_another_tenants_id_is_not_found(client):
    with pytest.raises(sandgate.NotFound):
        client.get("ex_00000000000000000000000000000000")


@pytest.mark.offline
def test_an_unreachable_gateway_is_unavailable():
    with Client("http://127.0.0.1:9", "sg_x") as client, pytest.raises(sandgate.Unavailable):
        client.run("print(1)")


@pytest.mark.offline
def test_a_server_error_becomes_unavailable_with_the_servers_message():
    error = sandgate.errors.from_response(500, {"error": {"code": "internal", "message": "internal error"}}, "", None)
    assert isinstance(error, sandgate.Unavailable) and error.message == "internal error"
    error = sandgate.errors.from_response(502, None, "bad gateway from a proxy", None)
    assert isinstance(error, sandgate.Unavailable) and "bad gateway from a proxy" in str(error)
    limited = sandgate.errors.from_response(
        429, {"error": {"code": "rate_limited", "message": "queue full"}}, "", "3"
    )
    assert isinstance(limited, sandgate.RateLimited) and limited.retry_after == 3.0


def test_sent_to_review_then_approved_runs(client, url, reviewer_key):
    execution = client.run("print('reviewed')", network=["example.org:443"])
    assert execution.status == "pending_approval"
    assert execution.approval_id
    answer = httpx.post(
        f"{url}/v1/approvals/{execution.approval_id}",
        headers={"Authorization": f"Bearer {reviewer_key}"},
        json={"decision": "approve", "comment": "ok"},
    )
    assert answer.status_code == 200, answer.text
    execution.wait_for_approval(timeout=120)
    assert execution.status == "succeeded"
    assert execution.stdout == "reviewed\n"


async def test_the_async_client_runs_and_streams(aclient):
    execution = await aclient.run("print(6 * 7)")
    assert (execution.status, execution.stdout) == ("succeeded", "42\n")
    kinds = [event.kind async for event in aclient.stream("echo hi", language="bash")]
    assert kinds[-1] == "exit" and "stdout" in kinds
    with pytest.raises(sandgate.PolicyDenied):
        await aclient.run("x", language="cobol")
