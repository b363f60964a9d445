"""What the sync and async clients share: request bodies, TLS, retries, the SSE parser."""

from __future__ import annotations

import base64
import os
import ssl
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import httpx

from .errors import SandgateError, Unavailable, from_response

FileContent = Union[bytes, str, "os.PathLike[str]"]
Destination = Union[str, Tuple[str, int], Mapping[str, Any]]

#: GETs are retried on these answers and on transport errors; POSTs never are (not idempotent).
RETRY_STATUSES = frozenset({502, 503, 504})
RETRY_ATTEMPTS = 3
RETRY_BACKOFF_S = 0.25
#: Executions may queue and run for minutes; connecting should not take long.
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=600.0, write=60.0, pool=60.0)


def headers(key: str) -> Dict[str, str]:
    return {"Authorization": f"Bearer {key}", "User-Agent": "sandgate-python/0.1"}


def tls(ca_file: Optional[str], cert: Optional[Tuple[str, str]]) -> Union[bool, ssl.SSLContext]:
    """``verify=`` for httpx: the system roots, or ``ca_file``, plus a client certificate."""
    if ca_file is None and cert is None:
        return True
    context = ssl.create_default_context(cafile=ca_file)
    if cert is not None:
        context.load_cert_chain(cert[0], cert[1])
    return context


def execution_body(
    code: str,
    language: str,
    files: Optional[Mapping[str, FileContent]],
    network: Optional[Sequence[Destination]],
    mounts: Optional[Sequence[str]],
    limits: Optional[Mapping[str, Any]],
    labels: Optional[Mapping[str, str]],
    wait: bool,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"language": language, "code": code, "wait": wait}
    if files:
        body["files"] = [{"path": name, "content_b64": _b64(content)} for name, content in files.items()]
    if network:
        body["network"] = [_destination(d) for d in network]
    if mounts:
        body["mounts"] = list(mounts)
    if limits:
        body["limits"] = dict(limits)
    if labels:
        body["labels"] = dict(labels)
    return body


def _b64(content: FileContent) -> str:
    """bytes as they are; a ``str`` or path-like is a file to read."""
    if isinstance(content, bytes):
        data = content
    else:
        with open(os.fspath(content), "rb") as handle:
            data = handle.read()
    return base64.b64encode(data).decode("ascii")


def _destination(destination: Destination) -> Dict[str, Any]:
    if isinstance(destination, str):
        host, sep, port = destination.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"network destination {destination!r}: write it as 'host:port'")
        return {"host": host, "port": int(port)}
    if isinstance(destination, tuple):
        return {"host": destination[0], "port": int(destination[1])}
    return {"host": destination["host"], "port": int(destination["port"])}


def raise_for(response: httpx.Response) -> None:
    """Raises the typed error for a non-2xx answer (the body must have been read)."""
    if response.is_success:
        return
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    raise from_response(response.status_code, body, response.text, response.headers.get("retry-after"))


def transport_error(err: httpx.TransportError, url: str) -> SandgateError:
    return Unavailable(f"cannot reach the gateway at {url}: {err}")


def should_retry(method: str, attempt: int, response: Optional[httpx.Response]) -> bool:
    if method != "GET" or attempt + 1 >= RETRY_ATTEMPTS:
        return False
    return response is None or response.status_code in RETRY_STATUSES


class SseParser:
    """Server-Sent Events, line by line: yields ``(event, data)`` at each blank line."""

    def __init__(self) -> None:
        self._event = "message"
        self._data: List[str] = []

    def feed(self, line: str) -> Iterable[Tuple[str, str]]:
        line = line.rstrip("\r\n")
        if not line:
            if self._data:
                yield self._event, "\n".join(self._data)
            self._event, self._data = "message", []
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)


def session_body(
    language: str,
    network: Optional[Sequence[Destination]],
    mounts: Optional[Sequence[str]],
    limits: Optional[Mapping[str, Any]],
    labels: Optional[Mapping[str, str]],
    idle_timeout_s: Optional[int],
    ttl_s: Optional[int],
) -> Dict[str, Any]:
    """``POST /v1/sessions`` (DESIGN 10)."""
    body = execution_body("", language, None, network, mounts, limits, labels, True)
    for unused in ("code", "wait"):
        body.pop(unused)
    if idle_timeout_s is not None:
        body["idle_timeout_s"] = idle_timeout_s
    if ttl_s is not None:
        body["ttl_s"] = ttl_s
    return body


def session_execution_body(
    code: str, files: Optional[Mapping[str, FileContent]], timeout_ms: Optional[int], wait: bool
) -> Dict[str, Any]:
    """``POST /v1/sessions/{id}/executions`` (DESIGN 10): code, files and a timeout only; the
    session's network, mounts and limits are those decided when it was created."""
    body = execution_body(code, "", files, None, None, None, None, wait)
    body.pop("language")
    if timeout_ms is not None:
        body["limits"] = {"timeout_ms": timeout_ms}
    return body
