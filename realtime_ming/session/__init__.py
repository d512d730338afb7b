"""Session stage: the per-connection Realtime state machine (Sans-I/O) and its asyncio driver."""

from .._lazy import lazy_exports

# lazy (PEP 562): importing a light submodule (session.config) must not load torch and every model module
_WHERE = {
    "Action": ".actions",
    "CancelTurn": ".actions",
    "CloseConversation": ".actions",
    "ConfirmTurn": ".actions",
    "DiscardTurn": ".actions",
    "ResponseFinished": ".actions",
    "Send": ".actions",
    "SubmitTurn": ".actions",
    "VAD_BACKENDS": ".config",
    "SessionSettings": ".config",
    "VadSettings": ".config",
    "SessionRunner": ".runner",
    "Session": ".session",
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _WHERE)
