"""The asynchronous client: ``await AsyncClient(url, key).run(code)``; mirrors ``Client``."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, AsyncIterator, Generator, Mapping, Optional, Sequence, Tuple

import httpx

from . import _wire
from .errors import SandgateError
from .errors import NotFound
from .models import Event, ExecutionRecord, SessionRecord, approval_outcome, event_from, record_from, session_from


class AsyncClient:
    """As ``Client``, with coroutines; use ``async with AsyncClient(url, key) as client``."""

    def __init__(
        self,
        url: str,
        key: str,
        *,
        ca_file: Optional[str] = None,
        cert: Optional[Tuple[str, str]] = None,
        timeout: httpx.Timeout = _wire.DEFAULT_TIMEOUT,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=_wire.headers(key),
            verify=_wire.tls(ca_file, cert),
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def run(
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
    ) -> "AsyncExecution":
        body = _wire.execution_body(code, language, files, network, mounts, limits, labels, wait)
        response = await self._request("POST", "/v1/executions", json=body)
        return AsyncExecution(self, record_from(response.json()))

    async def stream(self, code: str, language: str = "python", **options: Any) -> AsyncIterator[Event]:
        execution = await self.run(code, language, wait=False, **options)
        async for event in self.events(execution.id):
            yield event

    async def events(self, execution_id: str) -> AsyncIterator[Event]:
        parser = _wire.SseParser()
        try:
            async with self._http.stream("GET", f"/v1/executions/{execution_id}/events") as response:
                if not response.is_success:
                    await response.aread()
                    _wire.raise_for(response)
                async for line in response.aiter_lines():
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
    ) -> "_OpeningSession":
        """As ``Client.session``: ``async with client.session() as s`` opens it and closes it on
        leaving; ``s = await client.session()`` opens it (then ``await s.close()``)."""
        body = _wire.session_body(language, network, mounts, limits, labels, idle_timeout_s, ttl_s)
        return _OpeningSession(self, body)

    async def _open_session(self, body: Mapping[str, Any]) -> "AsyncSession":
        response = await self._request("POST", "/v1/sessions", json=body)
        return AsyncSession(self, session_from(response.json()))

    async def get_session(self, session_id: str) -> "AsyncSession":
        """As ``Client.get_session``."""
        response = await self._request("GET", f"/v1/sessions/{session_id}")
        return AsyncSession(self, session_from(response.json()))

    async def get(self, execution_id: str) -> "AsyncExecution":
        response = await self._request("GET", f"/v1/executions/{execution_id}")
        return AsyncExecution(self, record_from(response.json()))

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        attempt = 0
        while True:
            try:
                response = await self._http.request(method, path, **kwargs)
            except httpx.TransportError as err:
                if _wire.should_retry(method, attempt, None):
                    attempt += 1
                    await asyncio.sleep(_wire.RETRY_BACKOFF_S * attempt)
                    continue
                raise _wire.transport_error(err, self.url) from err
            if _wire.should_retry(method, attempt, response):
                attempt += 1
                await asyncio.sleep(_wire.RETRY_BACKOFF_S * attempt)
                continue
            _wire.raise_for(response)
            return response


class AsyncExecution(ExecutionRecord):
    def __init__(self, client: AsyncClient, record: ExecutionRecord) -> None:
        super().__init__(**record.__dict__)
        self._client = client

    async def refresh(self) -> "AsyncExecution":
        fresh = await self._client.get(self.id)
        self.__dict__.update({k: v for k, v in fresh.__dict__.items() if k != "_client"})
        return self

    async def download(self, path: str, dest: Optional["os.PathLike[str] | str"] = None) -> bytes:
        response = await self._client._request("GET", f"/v1/executions/{self.id}/outputs/{path}")
        if dest is not None:
            with open(os.fspath(dest), "wb") as handle:
                handle.write(response.content)
        return response.content

    async def cancel(self) -> "AsyncExecution":
        response = await self._client._request("POST", f"/v1/executions/{self.id}/cancel")
        self.__dict__.update(record_from(response.json()).__dict__)
        return self

    def events(self) -> AsyncIterator[Event]:
        return self._client.events(self.id)

    async def wait(self, timeout: float = 600.0, poll: float = 0.5) -> "AsyncExecution":
        deadline = time.monotonic() + timeout
        while not (await self.refresh()).finished:
            if time.monotonic() > deadline:
                raise SandgateError(f"execution {self.id} still {self.status} after {timeout} s")
            await asyncio.sleep(poll)
        return self

    async def wait_for_approval(self, timeout: float = 3600.0, poll: float = 1.0) -> "AsyncExecution":
        return await self.wait(timeout=timeout, poll=poll)


class _OpeningSession:
    """What ``AsyncClient.session`` returns: awaitable, or an async context manager."""

    def __init__(self, client: AsyncClient, body: Mapping[str, Any]) -> None:
        self._client = client
        self._body = body
        self._session: Optional["AsyncSession"] = None

    def __await__(self) -> Generator[Any, None, "AsyncSession"]:
        return self._client._open_session(self._body).__await__()

    async def __aenter__(self) -> "AsyncSession":
        self._session = await self._client._open_session(self._body)
        return self._session

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.close()


class AsyncSession(SessionRecord):
    def __init__(self, client: AsyncClient, record: SessionRecord) -> None:
        super().__init__(**record.__dict__)
        self._client = client

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def run(
        self,
        code: str,
        *,
        files: Optional[Mapping[str, _wire.FileContent]] = None,
        timeout_ms: Optional[int] = None,
        wait: bool = True,
    ) -> AsyncExecution:
        body = _wire.session_execution_body(code, files, timeout_ms, wait)
        response = await self._client._request("POST", f"/v1/sessions/{self.id}/executions", json=body)
        return AsyncExecution(self._client, record_from(response.json()))

    async def refresh(self) -> "AsyncSession":
        response = await self._client._request("GET", f"/v1/sessions/{self.id}")
        self.__dict__.update(session_from(response.json()).__dict__)
        return self

    async def wait_for_approval(self, timeout: float = 3600.0, poll: float = 1.0) -> "AsyncSession":
        """As ``Session.wait_for_approval``."""
        deadline = time.monotonic() + timeout
        while approval_outcome(self) is None:
            if time.monotonic() > deadline:
                raise SandgateError(f"session {self.id} still awaits approval {self.approval_id} after {timeout} s")
            await asyncio.sleep(poll)
            await self.refresh()
        return self

    async def close(self) -> None:
        try:
            await self._client._request("DELETE", f"/v1/sessions/{self.id}")
        except NotFound:
            pass
        self.status = "closed"
