"""The synchronous client: ``Client(url, key).run(code)``."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple

import httpx

from . import _wire
from .errors import SandgateError
from .errors import NotFound
from .models import Event, ExecutionRecord, SessionRecord, approval_outcome, event_from, record_from, session_from


class Client:
    """A sandgate gateway, called with one API key (an ``agent`` key to run code).

    ``ca_file`` trusts a private CA for ``https://`` URLs; ``cert=(cert_file, key_file)`` sends a
    client certificate (gateways configured with ``tls.client_ca_file`` require one).
    """

    def __init__(
        self,
        url: str,
        key: str,
        *,
        ca_file: Optional[str] = None,
        cert: Optional[Tuple[str, str]] = None,
        timeout: httpx.Timeout = _wire.DEFAULT_TIMEOUT,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            headers=_wire.headers(key),
            verify=_wire.tls(ca_file, cert),
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def run(
        self,
        code: str,
        language: str = "python",
        *,
        files: Optional[Mapping[str, _wire.FileContent]] = None,
        network: Optional[Sequence[_wire.Destination]] = None,
        mounts: Optional[Sequence[str]] = None,
        limits: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        wait: bool = True,
    ) -> "Execution":
        """Runs ``code`` and returns the execution (finished, unless ``wait=False`` or it was sent
        to review: then ``status`` is ``queued``/``running``/``pending_approval``).

        ``files`` maps a name in ``/workspace`` to bytes, or to a path (str or path-like) to read.
        Raises ``PolicyDenied`` (with ``reasons``) when the policy refuses.
        """
        body = _wire.execution_body(code, language, files, network, mounts, limits, labels, wait)
        return Execution(self, record_from(self._request("POST", "/v1/executions", json=body).json()))

    def stream(self, code: str, language: str = "python", **options: Any) -> Iterator[Event]:
        """Runs ``code`` and yields its ``stdout``/``stderr`` events as they happen, then ``exit``."""
        execution = self.run(code, language, wait=False, **options)
        return self.events(execution.id)

    def events(self, execution_id: str) -> Iterator[Event]:
        """The events of an execution (all of them again if it has finished)."""
        parser = _wire.SseParser()
        try:
            with self._http.stream("GET", f"/v1/executions/{execution_id}/events") as response:
                if not response.is_success:
                    response.read()
                    _wire.raise_for(response)
                for line in response.iter_lines():
                    for kind, data in parser.feed(line):
                        yield event_from(kind, data)
                        if kind == "exit":
                            return
        except httpx.TransportError as err:
            raise _wire.transport_error(err, self.url) from err

    def session(
        self,
        language: str = "python",
        *,
        network: Optional[Sequence[_wire.Destination]] = None,
        mounts: Optional[Sequence[str]] = None,
        limits: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        idle_timeout_s: Optional[int] = None,
        ttl_s: Optional[int] = None,
    ) -> "Session":
        """Opens a session (DESIGN 10): one sandbox whose interpreter, variables and
        ``/workspace`` persist across ``run`` calls; closed on leaving ``with``.
        Raises ``PolicyDenied`` when the policy refuses it; ``status`` is ``pending_approval``
        (with ``approval_id``) when it went to a reviewer: nothing runs in it until then
        (``run`` raises ``Conflict``), and ``wait_for_approval()`` waits for the decision."""
        body = _wire.session_body(language, network, mounts, limits, labels, idle_timeout_s, ttl_s)
        return Session(self, session_from(self._request("POST", "/v1/sessions", json=body).json()))

    def get_session(self, session_id: str) -> "Session":
        """An existing session of this key's tenant (``NotFound`` otherwise), to run in or close."""
        return Session(self, session_from(self._request("GET", f"/v1/sessions/{session_id}").json()))

    def get(self, execution_id: str) -> "Execution":
        return Execution(self, record_from(self._request("GET", f"/v1/executions/{execution_id}").json()))

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        attempt = 0
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as err:
                if _wire.should_retry(method, attempt, None):
                    attempt += 1
                    time.sleep(_wire.RETRY_BACKOFF_S * attempt)
                    continue
                raise _wire.transport_error(err, self.url) from err
            if _wire.should_retry(method, attempt, response):
                attempt += 1
                time.sleep(_wire.RETRY_BACKOFF_S * attempt)
                continue
            _wire.raise_for(response)
            return response


class Execution(ExecutionRecord):
    """An execution record, with the calls that act on it."""

    def __init__(self, client: Client, record: ExecutionRecord) -> None:
        super().__init__(**record.__dict__)
        self._client = client

    def refresh(self) -> "Execution":
        fresh = self._client.get(self.id)
        self.__dict__.update({k: v for k, v in fresh.__dict__.items() if k != "_client"})
        return self

    def download(self, path: str, dest: Optional["os.PathLike[str] | str"] = None) -> bytes:
        """The bytes of output file ``path``; also written to ``dest`` when given."""
        data = self._client._request("GET", f"/v1/executions/{self.id}/outputs/{path}").content
        if dest is not None:
            with open(os.fspath(dest), "wb") as handle:
                handle.write(data)
        return data

    def cancel(self) -> "Execution":
        body = self._client._request("POST", f"/v1/executions/{self.id}/cancel").json()
        self.__dict__.update(record_from(body).__dict__)
        return self

    def events(self) -> Iterator[Event]:
        return self._client.events(self.id)

    def wait(self, timeout: float = 600.0, poll: float = 0.5) -> "Execution":
        """Polls until the record is final (it is already when run with ``wait=True``)."""
        deadline = time.monotonic() + timeout
        while not self.refresh().finished:
            if time.monotonic() > deadline:
                raise SandgateError(f"execution {self.id} still {self.status} after {timeout} s")
            time.sleep(poll)
        return self

    def wait_for_approval(self, timeout: float = 3600.0, poll: float = 1.0) -> "Execution":
        """For a ``pending_approval`` execution: waits for a reviewer, then for the run to end.
        A rejection (or expiry) ends it as ``denied``, with the reviewer's reason in
        ``decision.reasons``."""
        return self.wait(timeout=timeout, poll=poll)

    def as_dict(self) -> Dict[str, Any]:
        return dict(self.raw)


class Session(SessionRecord):
    """A live session: ``with client.session() as s: s.run("x = 1"); s.run("x + 1").result``."""

    def __init__(self, client: Client, record: SessionRecord) -> None:
        super().__init__(**record.__dict__)
        self._client = client

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run(
        self,
        code: str,
        *,
        files: Optional[Mapping[str, _wire.FileContent]] = None,
        timeout_ms: Optional[int] = None,
        wait: bool = True,
    ) -> Execution:
        """Runs ``code`` in the session; ``.result`` is the repr of a final expression."""
        body = _wire.session_execution_body(code, files, timeout_ms, wait)
        response = self._client._request("POST", f"/v1/sessions/{self.id}/executions", json=body)
        return Execution(self._client, record_from(response.json()))

    def refresh(self) -> "Session":
        body = self._client._request("GET", f"/v1/sessions/{self.id}").json()
        self.__dict__.update(session_from(body).__dict__)
        return self

    def wait_for_approval(self, timeout: float = 3600.0, poll: float = 1.0) -> "Session":
        """For a ``pending_approval`` session: waits until a reviewer approved it and it is
        ``ready``. Raises ``SessionNotApproved`` when it closed instead (rejected, expired,
        withdrawn, or its sandbox did not start), ``SandgateError`` after ``timeout`` seconds.
        Returns at once for a session that was never held."""
        deadline = time.monotonic() + timeout
        while approval_outcome(self) is None:
            if time.monotonic() > deadline:
                raise SandgateError(f"session {self.id} still awaits approval {self.approval_id} after {timeout} s")
            time.sleep(poll)
            self.refresh()
        return self

    def close(self) -> None:
        """Deletes the session (its sandbox goes); closing one already closed is fine."""
        try:
            self._client._request("DELETE", f"/v1/sessions/{self.id}")
        except NotFound:
            pass
        self.status = "closed"
