"""`session.tracing`: one structured log record per finished response (README "Protocol support").

OpenAI sends traces to its dashboard; this server has no trace store, so it writes each response of a
traced session to the `realtime_ming.tracing` logger (INFO): the workflow name (`"auto"` = the default
workflow name), group id and metadata the client set, the session and response ids, status, and usage.
`tracing: null` (the default) writes nothing. Once enabled, the configuration cannot be changed
(`cannot_update_tracing`), as documented for OpenAI's Realtime API.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from ..protocol.dialect import Dialect
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.responses import ResponseStatus, Usage
from ..protocol.session import SessionConfig

__all__ = ["DEFAULT_WORKFLOW_NAME", "check_tracing_update", "trace_record", "trace_response"]

log = logging.getLogger("realtime_ming.tracing")

DEFAULT_WORKFLOW_NAME = "Realtime Session"  # OpenAI's default for `tracing: "auto"`


def check_tracing_update(old: SessionConfig, new: SessionConfig, param: str) -> None:
    """Raise `cannot_update_tracing` when an update changes tracing after it was enabled."""
    if old.tracing is not None and new.tracing != old.tracing:
        raise ProtocolError(ErrorCode.CANNOT_UPDATE_TRACING, param=param)


def trace_record(config: SessionConfig, response_id: str, status: ResponseStatus,
                 usage: Usage | None) -> dict | None:
    """The trace record of one response of a session with `config`, or None when tracing is off."""
    tracing = config.tracing
    if tracing is None:
        return None
    settings: Mapping = tracing if isinstance(tracing, Mapping) else {}
    return {
        "workflow_name": settings.get("workflow_name") or DEFAULT_WORKFLOW_NAME,
        "group_id": settings.get("group_id"),
        "metadata": settings.get("metadata"),
        "session_id": config.id,
        "response_id": response_id,
        "status": status.value,
        "usage": None if usage is None else usage.to_wire(Dialect.GA),
    }


def trace_response(config: SessionConfig, response_id: str, status: ResponseStatus, usage: Usage | None) -> None:
    """Log the trace record of a finished response (nothing when tracing is off)."""
    record = trace_record(config, response_id, status, usage)
    if record is not None:
        log.info("trace %s", json.dumps(record, ensure_ascii=False, default=str), extra={"trace": record})
