"""Server stage: websockets + uvloop serve loop, HTTP endpoints on the same port, one handler per connection."""

from .._lazy import lazy_exports

# lazy (PEP 562): importing a light submodule (server.config, server.startup) must not load torch and every model module
_WHERE = {
    "TINY_MODEL_NOTICE": ".run",
    "RealtimeServer": ".app",
    "ServingEngine": ".loading",
    "load_engine": ".loading",
    "run_server": ".run",
    "AuthConfig": ".config",
    "ConfigError": ".config",
    "LimitsConfig": ".config",
    "ListenConfig": ".config",
    "ServerConfig": ".config",
    "load_config": ".config",
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _WHERE)
