"""Server configuration: listener, auth, TLS and limits, and the root `ServerConfig` with its loader.

`load_config(path, overrides)` reads YAML or JSON into the frozen dataclass tree
(`server` / `session` / `engine`), rejects unknown keys by dotted path, converts values to the
field types and applies `a.b.c=value` overrides. Defaults live only in the dataclasses;
`load_serve_config` (the CLI's loader) adds the embedded tiny model's demo defaults, and
`resolve_api_keys` (run by the server when it starts) reads the keys that `server.auth.api_keys_file`
/ `api_keys_env` name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..engine.config import EngineConfig
from ..engine.hooks import EngineHooks
from ..session.config import SessionSettings

__all__ = [
    "TINY_MAX_OUTPUT_TOKENS",
    "AuthConfig",
    "ClientSecretsConfig",
    "ConfigError",
    "LimitsConfig",
    "ListenConfig",
    "ServerConfig",
    "TlsConfig",
    "VoicesConfig",
    "WebRtcConfig",
    "config_to_dict",
    "load_config",
    "load_serve_config",
    "resolve_api_keys",
]

# The embedded tiny random-weight model speaks noise: `realtime-ming serve` caps its replies at this
# many tokens (a few seconds of audio) unless the config sets session.max_output_tokens.
TINY_MAX_OUTPUT_TOKENS = 48


class ConfigError(ValueError):
    """A config file or override that does not fit the dataclass tree (message names the key)."""


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Empty `api_keys` = no auth. With `allowed_origins` set, a request that carries an Origin
    header (browsers) must match one entry exactly; requests without Origin (servers) pass.

    `api_keys_file` (one key per line, `#` comments) and `api_keys_env` (an environment variable
    holding comma-separated keys) keep secrets out of the config and the command line; the server
    adds their keys to `api_keys` when it starts (`resolve_api_keys`) and refuses a file or variable
    that is missing or holds none.
    A non-loopback `server.host` without any key refuses to start unless `allow_unauthenticated`.
    """

    api_keys: tuple[str, ...] = ()
    api_keys_file: str | None = None
    api_keys_env: str | None = None
    allowed_origins: tuple[str, ...] = ()
    allow_unauthenticated: bool = False  # serve a non-loopback address without keys (logs a warning)

    def __post_init__(self) -> None:
        if any(not k or k != k.strip() for k in self.api_keys):
            raise ValueError("server.auth.api_keys must be non-empty strings without surrounding spaces")


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """PEM certificate chain and private key: both set = `wss://` and `https://` on the one port."""

    certfile: str | None = None
    keyfile: str | None = None

    def __post_init__(self) -> None:
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("server.tls needs both certfile and keyfile (or neither)")

    @property
    def enabled(self) -> bool:
        return self.certfile is not None


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """Per-server and per-session resource limits. A session's memory is bounded in bytes: what its
    conversation stores (`max_conversation_bytes`, the oldest items are evicted with
    `conversation.item.deleted`), what waits to be sent (`max_outbound_bytes`: a client that lets more
    pile up is closed with 1008 "client is not reading"), and what one item may carry."""

    max_sessions: int = 32  # beyond -> close 1013 (try again later)
    max_frame_bytes: int = 16 * 2**20  # larger frames get a frame_too_large error (one append: <= 15 MiB)
    max_message_bytes: int = 64 * 2**20  # websockets max_size: larger frames close the connection (1009)
    # an event that carries no media (all but input_audio_buffer.append, conversation.item.create, response.create;
    # a response.create without audio, image or video too): larger frames get event_frame_too_large, refused from
    # their text without being decoded (a leading "type"; a response.create's media keys scanned as it arrives), else
    # right after decoding (megabytes of tools); max_frame_bytes applies first when it is the smaller
    max_control_frame_bytes: int = 2 * 2**20
    max_inbound_frames: int = 16  # websockets max_queue, and client events waiting for the session
    max_outbound_events: int = 1024  # per-session outbound queue, frames (beyond -> close 1008)
    max_outbound_bytes: int = 16 * 2**20  # per-session outbound queue, bytes held (beyond -> close 1008)
    idle_timeout_s: float = 600.0  # no client frame for this long -> close 1000 "idle timeout"
    send_timeout_s: float = 30.0  # a client that stops reading this long -> close 1008
    close_timeout_s: float = 2.0  # closing handshake; a peer that does not answer is then cut off (TCP abort)
    max_conversation_bytes: int = 128 * 2**20  # stored audio/images/text per session; oldest items evicted beyond
    max_image_pixels: int = 36_000_000  # image width x height, read from its header before decoding
    max_item_text_chars: int = 256 * 1024  # text of one content part
    max_video_s: float = 60.0  # one `input_video` clip, first to last frame (sampled at the model's 2 fps)
    max_images_per_s: float = 4.0  # `input_image` parts per session per second, sustained (token bucket)
    max_image_burst: int = 8  # ... at once: the bucket's size, so also the most images one event may carry
    # `input_video` seconds (first to last frame) per session per second, sustained (token bucket; its size is
    # max_video_s, so one longest clip fits): 1.0 = real time on average
    max_video_s_per_s: float = 1.0
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
class VoicesConfig:
    """Voice cloning (`POST /v1/realtime/voices`): upload validation and the bounded per-API-key store."""

    enabled: bool = True
    # The store: each API key gets a quota, its share of the whole (with K keys configured: at most
    # min(max_voices_per_key, max_voices // K) voices and max_store_bytes // K bytes); past its quota a key's own
    # least recently used voice is evicted, never another key's
    max_voices: int = 256  # in the store, all API keys together
    max_voices_per_key: int = 16  # per API key
    max_store_bytes: int = 256 * 2**20  # tensors held by the store, all API keys together
    max_upload_bytes: int = 8 * 2**20  # request body (wav, or JSON with base64 wav); larger -> 413
    min_duration_s: float = 1.0
    max_duration_s: float = 30.0
    min_sample_rate_hz: int = 8000
    max_sample_rate_hz: int = 192000
    max_channels: int = 2  # stereo is mixed down to mono
    max_transcript_chars: int = 1000
    max_name_chars: int = 64
    # registrations in progress at once, all keys together, each holding its slot from its first body byte (a client
    # that sends a head and no body holds none); more wait, first come first served, up to body_timeout_s, then 429
    max_pending: int = 8
    max_pending_per_key: int = 2  # ... per API key (without keys: per client address), counted from the head
    body_timeout_s: float = 5.0  # the body (and a free slot) must come within this of the head, else 408 (429)
    workers: int = 1  # threads computing embeddings + prompt latents (never the engine thread or event loop)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name != "enabled" and getattr(self, f.name) <= 0:
                raise ValueError(f"server.voices.{f.name} must be > 0")
        if self.min_duration_s > self.max_duration_s:
            raise ValueError("server.voices.min_duration_s must be <= max_duration_s")
        if self.min_sample_rate_hz > self.max_sample_rate_hz:
            raise ValueError("server.voices.min_sample_rate_hz must be <= max_sample_rate_hz")
        if self.max_pending_per_key > self.max_pending:
            raise ValueError("server.voices.max_pending_per_key must be <= max_pending")


@dataclass(frozen=True, slots=True)
class McpConfig:
    """Remote MCP tools (`tools: [{"type": "mcp"}]`): the server itself calls `server_url`, an SSRF surface, so
    it calls only the hosts listed here (host names or IP addresses, matched exactly; empty = MCP tools are
    refused with `mcp_tools_disabled`). Each call is bounded in time and in response bytes."""

    allowed_hosts: tuple[str, ...] = ()
    timeout_s: float = 10.0  # one listing or one call, connection included
    max_response_bytes: int = 1 * 2**20  # one listing or call result, as received

    def __post_init__(self) -> None:
        if any(not host or host != host.strip().lower() or "/" in host for host in self.allowed_hosts):
            raise ValueError("server.mcp.allowed_hosts takes lower-case host names or IP addresses (no scheme, path)")
        if not 0 < self.timeout_s <= 600:
            raise ValueError("server.mcp.timeout_s must be in (0, 600]")
        if self.max_response_bytes < 1024:
            raise ValueError("server.mcp.max_response_bytes must be >= 1024")


@dataclass(frozen=True, slots=True)
class ClientSecretsConfig:
    """Ephemeral keys (`POST /v1/realtime/client_secrets`, `ek_...`): minted by an API key for a browser, they
    open sessions on both transports as that key (its cloned voices and limits) with the minted session config.
    A secret lives `default_ttl_s` unless the request asks for `expires_after.seconds` in [min_ttl_s, max_ttl_s];
    `single_use` secrets open one session each (False: any number until they expire or are revoked)."""

    enabled: bool = True
    single_use: bool = True
    default_ttl_s: int = 600
    min_ttl_s: int = 10
    max_ttl_s: int = 7200
    max_secrets: int = 100_000  # outstanding, all keys together (beyond -> 429)
    max_secrets_per_key: int = 10_000  # outstanding per API key (beyond -> 429)
    max_request_bytes: int = 1 * 2**20  # the request body (a session config with instructions and tools)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name not in ("enabled", "single_use") and getattr(self, f.name) <= 0:
                raise ValueError(f"server.client_secrets.{f.name} must be > 0")
        if not self.min_ttl_s <= self.default_ttl_s <= self.max_ttl_s:
            raise ValueError("server.client_secrets needs min_ttl_s <= default_ttl_s <= max_ttl_s")


@dataclass(frozen=True, slots=True)
class WebRtcConfig:
    """WebRTC calls (`POST /v1/realtime/calls`): Opus audio on a media track, events on the `oai-events` data
    channel. `ice_servers`: STUN URLs (`stun:host:port`) the server's ICE agent asks for its public address;
    none = host candidates only (loopback, a LAN, a host with a public address)."""

    enabled: bool = True
    ice_servers: tuple[str, ...] = ()
    max_offer_bytes: int = 64 * 1024  # the SDP offer (multipart with a session config: max_request_bytes)
    connect_timeout_s: float = 20.0  # answer sent -> data channel open (ICE, DTLS, SCTP); past it the call ends

    def __post_init__(self) -> None:
        if self.max_offer_bytes <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("server.webrtc.max_offer_bytes and connect_timeout_s must be > 0")
        bad = [u for u in self.ice_servers if not u.startswith(("stun:", "stuns:"))]
        if bad:
            raise ValueError(f"server.webrtc.ice_servers takes stun: URLs, got {bad}")


@dataclass(frozen=True, slots=True)
class ListenConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0 = an ephemeral port (tests)
    model_id: str | None = None  # id advertised in /v1/models (None = the engine's model name)
    web_dir: str | None = None  # static demo folder (None = the demo inside the package, realtime_ming/web/)
    # processes serving the WebSockets (1 = the engine's own process). N >= 2: the engine runs alone in the main
    # process and N front-end processes share the port (server/frontends.py); raise it when one process's CPU
    # (its GIL) is the limit, about 30-45 real-time spoken sessions per front end; a cluster replica on the direct
    # data path runs them too (docs/cluster.md)
    frontend_processes: int = 1
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    voices: VoicesConfig = field(default_factory=VoicesConfig)
    mcp: McpConfig = field(default_factory=McpConfig)
    client_secrets: ClientSecretsConfig = field(default_factory=ClientSecretsConfig)
    webrtc: WebRtcConfig = field(default_factory=WebRtcConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError("server.port must be in [0, 65535]")
        if not 1 <= self.frontend_processes <= 256:
            raise ValueError("server.frontend_processes must be in [1, 256]")
        if self.voices.body_timeout_s >= self.limits.open_timeout_s:  # the handshake's deadline cuts a request off
            raise ValueError("server.voices.body_timeout_s must be < server.limits.open_timeout_s")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The whole process: `server` (listener), `session` (per-connection defaults), `engine`."""

    server: ListenConfig = field(default_factory=ListenConfig)
    session: SessionSettings = field(default_factory=SessionSettings)
    engine: EngineConfig = field(default_factory=EngineConfig)


def load_config(path: str | Path | None = None, overrides: typing.Iterable[str] = ()) -> ServerConfig:
    """Read `path` (YAML or JSON; None = all defaults), apply `key.path=value` overrides, validate.

    Override values are parsed as YAML scalars/lists (`true`, `3`, `[a, b]`, `null`) and then
    converted to the field's type. Raises ConfigError (one line) naming the file, override or
    dotted key on any mismatch.
    """
    return _build(ServerConfig, _merged_data(path, overrides), "")


def load_serve_config(path: str | Path | None = None, overrides: typing.Iterable[str] = ()) -> ServerConfig:
    """`load_config` plus the demo defaults of `realtime-ming serve`: the embedded tiny model's
    replies stop after `TINY_MAX_OUTPUT_TOKENS` unless the config sets session.max_output_tokens."""
    data = _merged_data(path, overrides)
    cfg = _build(ServerConfig, data, "")
    engine = cfg.engine
    tiny = engine.model_path is None and engine.weights == "checkpoint" and engine.preset in (None, "tiny")
    if tiny and "max_output_tokens" not in (data.get("session") or {}):
        cfg = dataclasses.replace(cfg, session=dataclasses.replace(cfg.session, max_output_tokens=TINY_MAX_OUTPUT_TOKENS))
    return cfg


def _merged_data(path: str | Path | None, overrides: typing.Iterable[str]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if path is not None:
        loaded = _read_file(Path(path))
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        data = loaded or {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r}: expected dotted.key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item}: the value is not valid YAML ({_yaml_problem(exc)}); "
                              "quote it, e.g. --set 'key=\"a: b\"'") from exc
        _set_dotted(data, key.strip().split("."), value)
    return data


def _read_file(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory; pass a .yaml or .json file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: JSON syntax error at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML syntax error {_yaml_problem(exc)}") from exc


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """'at line L column C: problem' of a PyYAML error, on one line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f"at line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
    return " ".join(f"{where}{problem}".split())


def resolve_api_keys(cfg: ServerConfig) -> ServerConfig:
    """`cfg` with the keys of `api_keys_file` / `api_keys_env` added to `api_keys` (deduplicated, in
    order; idempotent). Raises ConfigError when the file is unreadable or either source holds no key."""
    auth = cfg.server.auth
    keys = list(auth.api_keys)
    if auth.api_keys_file is not None:
        path = Path(auth.api_keys_file).expanduser()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"server.auth.api_keys_file: cannot read {path}: {exc.strerror or exc}") from exc
        found = [s for s in (line.strip() for line in lines) if s and not s.startswith("#")]
        if not found:
            raise ConfigError(f"server.auth.api_keys_file: {path} holds no key (one key per line)")
        keys += found
    if auth.api_keys_env is not None:
        found = [s for s in (k.strip() for k in os.environ.get(auth.api_keys_env, "").split(",")) if s]
        if not found:
            raise ConfigError(f"server.auth.api_keys_env: the environment variable {auth.api_keys_env} is unset "
                              f"or empty; export {auth.api_keys_env}=key1[,key2...]")
        keys += found
    unique = tuple(dict.fromkeys(keys))
    if unique == auth.api_keys:
        return cfg
    return dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, auth=dataclasses.replace(auth, api_keys=unique)))


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


_HOOKS = {f.name for f in dataclasses.fields(EngineHooks)}


def _build(cls: type, data: Any, where: str) -> Any:
    """Construct dataclass `cls` from mapping `data`; `where` is the dotted prefix for messages."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        hooks = [k for k in unknown if k in _HOOKS]
        hint = (f" ({', '.join(hooks)}: a test / benchmark hook, not a config key: `realtime-ming serve --hook "
                f"{hooks[0]}=VALUE`)" if hooks and where.startswith("engine") else "")
        raise ConfigError("unknown config key(s): " + ", ".join(_join(where, k) for k in unknown) + hint)
    complete = getattr(cls, "file_sections", None)  # a dataclass may complete its sections (EngineConfig)
    if complete is not None:
        data = complete(data)
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
