"""Sessions (DESIGN 10) against the live gateway: state kept between runs, closing on leaving
``with``, and the session routes' refusals as the SDK's exceptions. The gateway is started by
gateway/tests/e2e/python_sdk.rs with ``max_sessions: 2`` per tenant."""

import threading
import time

import httpx
import pytest

import sandgate
from sandgate import AsyncClient, Client


def test_state_persists_between_runs_and_the_session_closes_on_exit(client):
    with client.session(language="python", idle_timeout_s=120) as session:
        assert session.status == "ready" and session.decision.allow
        first = session.run("x = 41")
        assert first.status == "succeeded" and first.session_id == session.id
        assert first.result is None
        assert session.run("x + 1").result == "42"
        session.run("open('/workspace/kept.txt', 'w').write('kept')")
        assert session.run("open('kept.txt').read()").result == "'kept'"
        failed = session.run("1 / 0")
        assert failed.status == "failed" and "ZeroDivisionError" in failed.stderr
        assert session.run("x").result == "41", "an exception must leave the session usable"
        assert session.refresh().raw["executions"] == 6
    assert session.status == "closed"
    assert session.refresh().closed_reason == "deleted"
    with pytest.raises(sandgate.Conflict):
        session.run("x")
    session.close()  # closing a closed session again is fine


def test_bash_sessions_keep_the_shell(client):
    with client.session(language="bash") as session:
        session.run("cd /tmp; export A=1")
        ran = session.run("pwd; echo $A")
        assert ran.stdout == "/tmp\n1\n" and ran.exit_code == 0


def test_a_second_run_while_one_runs_is_a_conflict(client, url, key):
    with client.session() as session:
        slow = {}
        worker = threading.Thread(target=lambda: slow.update(run=session.run("import time\ntime.sleep(3)\n'slept'")))
        worker.start()
        time.sleep(1.0)
        with Client(url, key) as other:
            with pytest.raises(sandgate.Conflict) as busy:
                other.get_session(session.id).run("1")
        assert busy.value.status == 409 and "busy" in str(busy.value)
        worker.join()
        assert slow["run"].result == "'slept'"


def test_a_timeout_interrupts_the_code_and_the_session_lives_on(client):
    with client.session() as session:
        spun = session.run("while True:\n    pass", timeout_ms=1000)
        assert spun.status == "timeout"
        assert session.run("print('alive')").stdout == "alive\n"


def test_another_tenant_gets_not_found(client, url, other_tenant_key):
    with client.session() as session:
        with Client(url, other_tenant_key) as stranger:
            with pytest.raises(sandgate.NotFound):
                stranger.get_session(session.id).run("1")
            with pytest.raises(sandgate.NotFound):
                stranger.get_session(session.id).refresh()
        assert session.run("1 + 1").result == "2"


def test_beyond_max_sessions_is_rate_limited(client):
    with client.session() as first, client.session() as second:
        assert first.id != second.id
        with pytest.raises(sandgate.RateLimited) as limited:
            client.session()
        assert limited.value.status == 429 and "max_sessions" in str(limited.value)
    with client.session() as again:
        assert again.status == "ready", "closed sessions must free their place"


def test_a_refused_session_raises_policy_denied(url, other_tenant_key, client):
    with Client(url, other_tenant_key) as classroom:
        with pytest.raises(sandgate.PolicyDenied) as denied:
            classroom.session(language="python")
    assert [reason.code for reason in denied.value.reasons] == ["session.not_allowed"]
    with pytest.raises(sandgate.InvalidRequest) as invalid:
        client.session(language="cobol")
    assert "python or bash" in str(invalid.value)


async def test_async_sessions_keep_state_and_close(url, key):
    async with AsyncClient(url, key) as client:
        async with client.session(language="python") as session:
            await session.run("x = 41")
            assert (await session.run("x + 1")).result == "42"
        assert session.status == "closed"
        opened = await client.session()
        assert (await opened.run("'still'")).result == "'still'"
        await opened.close()
        assert (await opened.refresh()).closed_reason == "deleted"


def _review(url: str, reviewer_key: str, approval_id: str, decision: str) -> None:
    answer = httpx.post(
        f"{url}/v1/approvals/{approval_id}",
        headers={"Authorization": f"Bearer {reviewer_key}"},
        json={"decision": decision},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text


def test_a_session_held_for_review_opens_once_approved(client, url, reviewer_key):
    with client.session(network=["review.example:443"]) as session:
        assert session.status == "pending_approval" and session.approval_id
        with pytest.raises(sandgate.Conflict) as waiting:
            session.run("1")
        assert session.approval_id in str(waiting.value)
        _review(url, reviewer_key, session.approval_id, "approve")
        assert session.wait_for_approval(timeout=120, poll=0.2) is session
        assert session.status == "ready"
        session.run("x = 1")
        assert session.run("x + 1").result == "2"


def test_a_rejected_session_raises_session_not_approved(client, url, reviewer_key):
    session = client.session(network=["review.example:443"])
    assert session.status == "pending_approval"
    _review(url, reviewer_key, session.approval_id, "reject")
    with pytest.raises(sandgate.SessionNotApproved) as refused:
        session.wait_for_approval(timeout=60, poll=0.2)
    assert refused.value.closed_reason == "denied"
    assert refused.value.approval_id == session.approval_id
