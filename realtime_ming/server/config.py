"""Server configuration: listener, auth and limits, and the root `ServerConfig` with its loader.

`load_config(path, overrides)` reads YAML or JSON into the frozen dataclass tree
(`server` / `session` / `engine`), rejects unknown keys by dotted path, converts values to the
field types and applies `a.b.c=value` overrides. Defaults live only in the dataclasses.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..engine.config import EngineConfig
from ..session.config import SessionSettings

__all__ = [
    "AuthConfig",
    "ConfigError",
    "LimitsConfig",
    "ListenConfig",
    "ServerConfig",
    "config_to_dict",
    "load_config",
]


class ConfigError(ValueError):
    """A config file or override that does not fit the dataclass tree (message names the key)."""


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Empty `api_keys` = no auth. With `allowed_origins` set, a request that carries an Origin
    header (browsers) must match one entry exactly; requests without Origin (servers) pass."""

    api_keys: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_sessions: int = 32  # beyond -> close 1013 (try again later)
    max_frame_bytes: int = 16 * 2**20  # larger frames get a frame_too_large error (one append: <= 15 MiB)
    max_message_bytes: int = 64 * 2**20  # websockets max_size: larger frames close the connection (1009)
    max_inbound_frames: int = 16  # websockets max_queue, and client events waiting for the session
    max_outbound_events: int = 1024  # per-session outbound queue (overflow: the session pauses)
    idle_timeout_s: float = 600.0  # no client frame for this long -> close 1000 "idle timeout"
    send_timeout_s: float = 30.0  # a client that stops reading this long -> close 1008
    open_timeout_s: float = 10.0  # WebSocket opening handshake
    drain_timeout_s: float = 20.0  # SIGTERM: responses in progress get this long to finish, then sessions close
    shutdown_timeout_s: float = 5.0  # graceful shutdown: wait for handlers this long

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"server.limits.{f.name} must be > 0")
        if self.max_message_bytes < self.max_frame_bytes:
            raise ValueError("server.limits.max_message_bytes must be >= max_frame_bytes")


@dataclass(frozen=True, slots=True)
class ListenConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0 = an ephemeral port (tests)
    model_id: str | None = None  # id advertised in /v1/models (None = the engine's model name)
    web_dir: str | None = None  # static demo folder (None = the repo's / package's web/)
    auth: AuthConfig = field(default_factory=AuthConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError("server.port must be in [0, 65535]")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The whole process: `server` (listener), `session` (per-connection defaults), `engine`."""

    server: ListenConfig = field(default_factory=ListenConfig)
    session: SessionSettings = field(default_factory=SessionSettings)
    engine: EngineConfig = field(default_factory=EngineConfig)


def load_config(path: str | Path | None = None, overrides: typing.Iterable[str] = ()) -> ServerConfig:
    """Read `path` (YAML or JSON; None = all defaults), apply `key.path=value` overrides, validate.

    Override values are parsed as YAML scalars/lists (`true`, `3`, `[a, b]`, `null`) and then
    converted to the field's type. Raises ConfigError naming the dotted key on any mismatch.
    """
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        loaded = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        data = loaded or {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r}: expected dotted.key=value")
        _set_dotted(data, key.strip().split("."), yaml.safe_load(raw) if raw.strip() else "")
    return _build(ServerConfig, data, "")


def config_to_dict(cfg: Any) -> Any:
    """The dataclass tree as plain data (tuples as lists) for logging and /health."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (tuple, list)):
        return [config_to_dict(v) for v in cfg]
    return cfg


def _set_dotted(data: dict, keys: list[str], value: Any) -> None:
    node = data
    for i, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(keys[: i + 1])} is not a section")
        node = child
    node[keys[-1]] = value


def _build(cls: type, data: Any, where: str) -> Any:
    """Construct dataclass `cls` from mapping `data`; `where` is the dotted prefix for messages."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError("unknown config key(s): " + ", ".join(_join(where, k) for k in unknown))
    kwargs = {k: _convert(hints[k], v, _join(where, k)) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or 'config'}: {exc}") from exc


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _convert(tp: Any, value: Any, where: str) -> Any:
    """Convert a YAML/JSON value to annotation `tp` (dataclass, optional, tuple, scalar)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for arg in inner:
            try:
                return _convert(arg, value, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} fits none of {inner}")
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in (s.strip() for s in value.split(",")) if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item_tp = typing.get_args(tp)[0]
        return tuple(_convert(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value))
    return _scalar(tp, value, where)


def _scalar(tp: Any, value: Any, where: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if value is None:
        raise ConfigError(f"{where}: must not be null")
    return value
