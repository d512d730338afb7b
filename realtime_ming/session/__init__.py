"""Session stage: the per-connection Realtime state machine (Sans-I/O) and its asyncio driver."""

from .actions import (
    Action,
    CancelTurn,
    CloseConversation,
    ConfirmTurn,
    DiscardTurn,
    ResponseFinished,
    Send,
    SubmitTurn,
)
from .config import VAD_BACKENDS, SessionSettings, VadSettings
from .runner import SessionRunner
from .session import Session

__all__ = [
    "VAD_BACKENDS",
    "Action",
    "CancelTurn",
    "CloseConversation",
    "ConfirmTurn",
    "DiscardTurn",
    "ResponseFinished",
    "Send",
    "Session",
    "SessionRunner",
    "SessionSettings",
    "SubmitTurn",
    "VadSettings",
]
