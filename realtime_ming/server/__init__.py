"""Server stage: websockets + uvloop serve loop, HTTP endpoints on the same port, one handler per connection."""

from .app import (
    TINY_MODEL_NOTICE,
    RealtimeServer,
    ServingEngine,
    load_engine,
    run_server,
)
from .config import (
    AuthConfig,
    ConfigError,
    LimitsConfig,
    ListenConfig,
    ServerConfig,
    load_config,
)

__all__ = [
    "TINY_MODEL_NOTICE",
    "AuthConfig",
    "ConfigError",
    "LimitsConfig",
    "ListenConfig",
    "RealtimeServer",
    "ServerConfig",
    "ServingEngine",
    "load_config",
    "load_engine",
    "run_server",
]
