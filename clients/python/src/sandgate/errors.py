"""Errors the gateway answers, as exceptions. Every non-2xx answer raises one; none is swallowed.

The gateway's error shape is ``{"error": {"code", "message", "reasons"?, "execution_id"?}}``
(DESIGN 4.2); ``code`` picks the class, and an answer without that shape (a proxy's 502, say)
still raises, with the text it carried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Type


@dataclass(frozen=True)
class Reason:
    """Why the policy decided as it did: a bounded dotted code and a sentence."""

    code: str
    message: str


class SandgateError(Exception):
    """Any error answer of the gateway, or a transport failure (``status`` 0)."""

    def __init__(self, message: str, *, status: int = 0, code: str = "", body: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.body = body


class InvalidRequest(SandgateError):
    """400: the request was malformed or broke a limit; the message says what to change."""


class Unauthenticated(SandgateError):
    """401: no key, or a key the gateway does not know."""


class Forbidden(SandgateError):
    """403: the key's role may not do this."""


class PolicyDenied(Forbidden):
    """403 ``policy_denied``: the policy refused; nothing ran. ``reasons`` says why."""

    def __init__(self, message: str, *, reasons: List[Reason], execution_id: Optional[str], **kw: Any) -> None:
        super().__init__(message, **kw)
        self.reasons = reasons
        self.execution_id = execution_id

    def __str__(self) -> str:
        why = "; ".join(f"{r.code}: {r.message}" for r in self.reasons)
        return f"{self.message} ({why})" if why else self.message


class NotFound(SandgateError):
    """404: no such execution (or another tenant's), approval or file."""


class Conflict(SandgateError):
    """409: e.g. cancelling an execution that has already finished."""


class SessionNotApproved(SandgateError):
    """A session held for review (``pending_approval``) closed instead of becoming ``ready``:
    ``closed_reason`` is ``denied`` (a reviewer rejected it), ``expired`` (nobody decided in
    time), ``deleted`` (withdrawn) or ``start_failed`` (approved, but its sandbox did not start).
    Raised by ``Session.wait_for_approval``."""

    def __init__(self, message: str, *, session_id: str, approval_id: Optional[str],
                 closed_reason: Optional[str], **kw: Any) -> None:
        super().__init__(message, **kw)
        self.session_id = session_id
        self.approval_id = approval_id
        self.closed_reason = closed_reason


class PayloadTooLarge(SandgateError):
    """413: the request body is over the gateway's limit."""


class RateLimited(SandgateError):
    """429: too many queued executions; ``retry_after`` (seconds) when the gateway said."""

    def __init__(self, message: str, *, retry_after: Optional[float] = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class Unavailable(SandgateError):
    """503 (the audit store is down: nothing ran), any 5xx, or the gateway unreachable."""


_BY_CODE: Dict[str, Type[SandgateError]] = {
    "invalid_request": InvalidRequest,
    "unauthenticated": Unauthenticated,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "payload_too_large": PayloadTooLarge,
    "unavailable": Unavailable,
}

_BY_STATUS: Dict[int, Type[SandgateError]] = {
    400: InvalidRequest,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
}


def from_response(status: int, body: Any, text: str, retry_after: Optional[str]) -> SandgateError:
    """The exception for an error answer (``body``: its JSON, or None when it had none)."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        message = text.strip() or f"HTTP {status}"
        cls = _BY_STATUS.get(status, Unavailable if status >= 500 else SandgateError)
        return cls(f"HTTP {status}: {message}", status=status, body=body)
    code = str(error.get("code", ""))
    message = str(error.get("message", f"HTTP {status}"))
    common: Dict[str, Any] = {"status": status, "code": code, "body": body}
    if code == "policy_denied":
        reasons = [Reason(str(r.get("code", "")), str(r.get("message", ""))) for r in error.get("reasons") or []]
        return PolicyDenied(message, reasons=reasons, execution_id=error.get("execution_id"), **common)
    if code == "rate_limited":
        return RateLimited(message, retry_after=_seconds(retry_after), **common)
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status) or (Unavailable if status >= 500 else SandgateError)
    return cls(message, **common)


def _seconds(value: Optional[str]) -> Optional[float]:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
