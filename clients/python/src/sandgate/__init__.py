"""sandgate: run untrusted code through a sandgate gateway, from Python.

    from sandgate import Client
    with Client("http://127.0.0.1:8080", key) as client:
        print(client.run("print(1 + 1)").stdout)

Every call is decided by the gateway's policy and audited there; this package only speaks its
HTTP API (``GET /v1/openapi.json`` describes it). Errors are exceptions (``sandgate.errors``).
"""

from .aio import AsyncClient, AsyncExecution, AsyncSession
from .client import Client, Execution, Session
from .errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    PolicyDenied,
    RateLimited,
    Reason,
    SandgateError,
    SessionNotApproved,
    Unauthenticated,
    Unavailable,
)
from .models import FINAL_STATUSES, Decision, Event, OutputFile

__all__ = [
    "AsyncClient",
    "AsyncExecution",
    "AsyncSession",
    "Client",
    "Conflict",
    "Decision",
    "Event",
    "Execution",
    "FINAL_STATUSES",
    "Forbidden",
    "InvalidRequest",
    "NotFound",
    "OutputFile",
    "PayloadTooLarge",
    "PolicyDenied",
    "RateLimited",
    "Reason",
    "SandgateError",
    "Session",
    "SessionNotApproved",
    "Unauthenticated",
    "Unavailable",
]
__version__ = "0.1.0"
