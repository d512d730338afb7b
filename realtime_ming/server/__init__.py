"""Server stage: websockets + uvloop serve loop, HTTP endpoints on the same port, one handler per connection."""

import importlib

# lazy (PEP 562): importing a light submodule (server.config, server.startup) must not load torch and every model module
_WHERE = {
    "TINY_MODEL_NOTICE": ".app",
    "RealtimeServer": ".app",
    "ServingEngine": ".app",
    "load_engine": ".app",
    "run_server": ".app",
    "AuthConfig": ".config",
    "ConfigError": ".config",
    "LimitsConfig": ".config",
    "ListenConfig": ".config",
    "ServerConfig": ".config",
    "load_config": ".config",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


def __dir__() -> list[str]:
    return __all__
