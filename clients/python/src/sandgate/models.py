"""What the gateway answers, as dataclasses (the wire shapes of ``GET /v1/openapi.json``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .errors import Reason, SessionNotApproved

#: Statuses after which an execution never changes again.
FINAL_STATUSES = frozenset(
    {"succeeded", "failed", "timeout", "oom", "killed", "cancelled", "denied", "error"}
)


@dataclass(frozen=True)
class Decision:
    id: str
    allow: bool
    backend: Optional[str]
    reasons: List[Reason]
    policy_revision: str


@dataclass(frozen=True)
class OutputFile:
    """A file the code wrote to ``/output``; fetch it with ``Execution.download(path)``."""

    path: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Event:
    """One Server-Sent Event of ``stream``: ``kind`` is ``stdout``, ``stderr`` or ``exit``.

    ``text`` is the output for stdout/stderr; ``exit`` carries ``status`` and ``exit_code``.
    """

    kind: str
    text: str = ""
    status: Optional[str] = None
    exit_code: Optional[int] = None
    data: Dict[str, Any] = field(default_factory=dict)


@dataclass
class ExecutionRecord:
    """The fields of an execution record (DESIGN 4.2)."""

    id: str
    status: str
    language: str = ""
    stdout: str = ""
    stderr: str = ""
    exit_code: Optional[int] = None
    duration_ms: Optional[int] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    outputs: List[OutputFile] = field(default_factory=list)
    decision: Optional[Decision] = None
    approval_id: Optional[str] = None
    error: Optional[str] = None
    #: Inside a session: the session, and the ``repr`` of the code's last expression (python).
    session_id: Optional[str] = None
    result: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES


def record_from(body: Dict[str, Any]) -> ExecutionRecord:
    decision = body.get("decision")
    return ExecutionRecord(
        id=body["id"],
        status=body["status"],
        language=body.get("language", ""),
        stdout=body.get("stdout") or "",
        stderr=body.get("stderr") or "",
        exit_code=body.get("exit_code"),
        duration_ms=body.get("duration_ms"),
        stdout_truncated=bool(body.get("stdout_truncated")),
        stderr_truncated=bool(body.get("stderr_truncated")),
        outputs=[OutputFile(o["path"], int(o["bytes"]), o.get("sha256", "")) for o in body.get("outputs") or []],
        decision=_decision(decision) if isinstance(decision, dict) else None,
        approval_id=body.get("approval_id"),
        error=body.get("error"),
        session_id=body.get("session_id"),
        result=body.get("result"),
        raw=body,
    )


def _decision(body: Dict[str, Any]) -> Decision:
    return Decision(
        id=body.get("id", ""),
        allow=bool(body.get("allow")),
        backend=body.get("backend"),
        reasons=[Reason(r.get("code", ""), r.get("message", "")) for r in body.get("reasons") or []],
        policy_revision=body.get("policy_revision", ""),
    )


def event_from(kind: str, data: str) -> Event:
    try:
        payload = json.loads(data) if data else {}
    except ValueError:
        payload = {"text": data}
    if not isinstance(payload, dict):
        payload = {"value": payload}
    return Event(
        kind=kind,
        text=str(payload.get("text", "")),
        status=payload.get("status"),
        exit_code=payload.get("exit_code"),
        data=payload,
    )


@dataclass
class SessionRecord:
    """A session (DESIGN 10): one sandbox kept across several executions."""

    id: str
    status: str
    decision: Optional[Decision] = None
    expires_at: Optional[str] = None
    approval_id: Optional[str] = None
    closed_reason: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)


def approval_outcome(session: SessionRecord) -> Optional[bool]:
    """For a session that was held for review: ``None`` while it waits, ``True`` once it is
    open, ``False`` once it closed without opening (raises ``SessionNotApproved``)."""
    if session.status == "pending_approval":
        return None
    if session.status == "closed":
        raise SessionNotApproved(
            f"session {session.id} was not opened: it closed ({session.closed_reason}) "
            f"instead of being approved (approval {session.approval_id})",
            session_id=session.id,
            approval_id=session.approval_id,
            closed_reason=session.closed_reason,
        )
    return True


def session_from(body: Dict[str, Any]) -> SessionRecord:
    decision = body.get("decision")
    return SessionRecord(
        id=body["id"],
        status=body["status"],
        decision=_decision(decision) if isinstance(decision, dict) else None,
        expires_at=body.get("expires_at"),
        approval_id=body.get("approval_id"),
        closed_reason=body.get("closed_reason"),
        raw=body,
    )
