"""Session stage: the per-connection Realtime state machine (Sans-I/O) and its asyncio driver."""

import importlib

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
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


def __dir__() -> list[str]:
    return __all__
