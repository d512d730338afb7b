"""What `realtime-ming serve` tells a person about its configuration.

At INFO the server logs a short summary (`summary`): the model, the devices, where it listens, how it
authenticates, and where the full configuration is. The full effective configuration (`config_yaml`: YAML,
API keys redacted) is logged at DEBUG and printed by `realtime-ming serve --print-config`.
"""

from __future__ import annotations

from typing import Any

import yaml

from .config import ServerConfig, config_to_dict

__all__ = ["config_yaml", "redacted", "summary"]

FULL_CONFIG_HINT = "`realtime-ming serve ... --print-config` prints it, --log-level DEBUG logs it"


def redacted(cfg: ServerConfig) -> dict[str, Any]:
    """The config as plain data with the API keys replaced by their count."""
    data = config_to_dict(cfg)
    keys = data["server"]["auth"]["api_keys"]
    data["server"]["auth"]["api_keys"] = [f"<{len(keys)} key(s)>"] if keys else []
    return data


def config_yaml(cfg: ServerConfig) -> str:
    """The full effective config as YAML, API keys redacted."""
    return yaml.safe_dump(redacted(cfg), sort_keys=False, default_flow_style=None, width=120).rstrip()


def summary(cfg: ServerConfig, port: int | None = None) -> str:
    """A few lines for a person: model, devices, listen address (`port`: the bound one), auth, and where the
    full config is."""
    rows = [
        ("model", _model(cfg)),
        ("devices", _devices(cfg)),
        ("listen", _listen(cfg, port)),
        ("auth", _auth(cfg)),
        ("config", f"the whole effective config: {FULL_CONFIG_HINT}"),
    ]
    return "\n".join(f"  {name + ':':9}{text}" for name, text in rows)


def _model(cfg: ServerConfig) -> str:
    engine = cfg.engine
    if engine.weights == "dummy":
        return f"preset {engine.preset or 'tiny'} with dummy (random) weights, {engine.dtype} — for benchmarks, not speech"
    if engine.model_path is None:
        return "the embedded tiny Ming, random weights: its output is noise, not speech (--model-path serves a checkpoint)"
    tokenizer = f", tokenizer {engine.tokenizer_path}" if engine.tokenizer_path else ""
    return f"checkpoint {engine.model_path}{tokenizer}, {engine.dtype}"


def _devices(cfg: ServerConfig) -> str:
    place = cfg.engine.placement
    thinker = ", ".join(place.thinker_devices)
    tp = len(place.thinker_devices)
    parts = [f"thinker {thinker}" + (f" (TP={tp})" if tp > 1 else "")]
    if place.talker_devices:
        parts.append(f"talker + VAE replicas on {', '.join(place.talker_devices)}")
    elif place.talker_device == place.vae_device:
        parts.append(f"talker + VAE {place.talker_device}")
    else:
        parts.append(f"talker {place.talker_device}, VAE {place.vae_device}")
    parts.append(f"encoders {place.encoder_device}")
    return "; ".join(parts)


def _listen(cfg: ServerConfig, port: int | None) -> str:
    server = cfg.server
    scheme = "wss" if server.tls.certfile else "ws"
    host = f"[{server.host}]" if ":" in server.host else server.host
    port = port or server.port or "<any free port>"
    where = f"{scheme}://{host}:{port}/v1/realtime"
    procs = server.frontend_processes
    fronts = f"{procs} front-end processes" if procs > 1 else "one process"
    return f"{where}, {fronts}, at most {server.limits.max_sessions} sessions"


def _auth(cfg: ServerConfig) -> str:
    auth = cfg.server.auth
    origins = "any Origin" if not auth.allowed_origins else f"Origins {', '.join(auth.allowed_origins)}"
    if auth.api_keys:
        source = (f" from ${auth.api_keys_env}" if auth.api_keys_env
                  else f" from {auth.api_keys_file}" if auth.api_keys_file else "")
        return f"{len(auth.api_keys)} API key(s){source}; {origins}"
    if auth.allow_unauthenticated:
        return f"none (--allow-unauthenticated); {origins}"
    return f"none (loopback only); {origins}"

