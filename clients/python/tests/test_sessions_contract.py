"""Sessions against the DESIGN 10 contract, with a recorded fake of the wire (httpx's
MockTransport): exactly what the SDK sends and how it reads the answers. test_sessions.py runs
the same calls against the live gateway."""

import json

import httpx
import pytest

import sandgate
from sandgate import AsyncClient, Client

pytestmark = pytest.mark.offline


class Gateway:
    """Answers /v1/sessions as DESIGN 10 says, keeping `x` like a notebook would."""

    def __init__(self):
        self.requests = []
        self.open = True

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, body))
        path = request.url.path
        if (request.method, path) == ("POST", "/v1/sessions"):
            if body["language"] == "cobol":
                error = {"code": "policy_denied", "message": "denied",
                         "reasons": [{"code": "language.not_allowed", "message": "no"}]}
                return httpx.Response(403, json={"error": error})
            return httpx.Response(201, json={"id": "ss_1", "status": "ready", "expires_at": "2026-12-01T17:00:00Z",
                                             "decision": {"id": "dc_1", "allow": True, "backend": "gvisor",
                                                          "reasons": [], "policy_revision": "sha256:x"}})
        if (request.method, path) == ("POST", "/v1/sessions/ss_1/executions"):
            result = "2" if body["code"] == "x + 1" else None
            return httpx.Response(200, json={"id": "ex_2", "status": "succeeded", "stdout": "", "stderr": "",
                                             "exit_code": 0, "session_id": "ss_1", "result": result})
        if (request.method, path) == ("DELETE", "/v1/sessions/ss_1"):
            if not self.open:
                return httpx.Response(404, json={"error": {"code": "not_found", "message": "gone"}})
            self.open = False
            return httpx.Response(200, json={"id": "ss_1", "status": "closed", "closed_reason": "deleted"})
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no such route"}})


def test_a_session_keeps_state_between_runs_and_closes_on_exit():
    gateway = Gateway()
    client = Client("http://gateway.test", "sg_key", transport=httpx.MockTransport(gateway))
    with client.session(language="python", limits={"timeout_ms": 5000}, ttl_s=600) as session:
        assert session.status == "ready" and session.decision.allow
        session.run("x = 1")
        assert session.run("x + 1", timeout_ms=1000).result == "2"
    assert session.status == "closed"
    assert gateway.requests == [
        ("POST", "/v1/sessions", {"language": "python", "limits": {"timeout_ms": 5000}, "ttl_s": 600}),
        ("POST", "/v1/sessions/ss_1/executions", {"code": "x = 1", "wait": True}),
        ("POST", "/v1/sessions/ss_1/executions", {"code": "x + 1", "wait": True, "limits": {"timeout_ms": 1000}}),
        ("DELETE", "/v1/sessions/ss_1", None),
    ]
    session.close()  # closing again is fine


def test_a_refused_session_raises_policy_denied():
    client = Client("http://gateway.test", "sg_key", transport=httpx.MockTransport(Gateway()))
    with pytest.raises(sandgate.PolicyDenied) as denied:
        client.session(language="cobol")
    assert denied.value.reasons[0].code == "language.not_allowed"


async def test_the_async_session_speaks_the_same_contract():
    gateway = Gateway()

    async def handler(request):
        return gateway(request)

    async with AsyncClient("http://gateway.test", "sg_key", transport=httpx.MockTransport(handler)) as client:
        async with await client.session() as session:
            assert (await session.run("x + 1")).result == "2"
    assert gateway.requests[-1] == ("DELETE", "/v1/sessions/ss_1", None)
