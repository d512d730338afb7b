"""Start-up checks of `realtime-ming serve`: everything knowable is validated before the model loads.

`check_config(cfg)` looks at the model folder (files, weights index, tokenizers), the devices of
`engine.placement` against this torch build and its GPUs, the configured voice, the exposure of the
listen address and the TLS files. `open_listener` binds the port up front (a port in use fails in a
second, not after minutes of loading; the bound socket is handed to websockets, so no race), and
`load_failure` turns the specific exceptions that can only happen while loading into one line. Every
refusal is a `StartupError` whose message is one line saying what is wrong and what to do.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
import ssl
import sys
from pathlib import Path

from ..engine.config import EngineConfig
from .config import ServerConfig, TlsConfig

__all__ = [
    "StartupError",
    "check_config",
    "check_exposure",
    "is_loopback",
    "load_failure",
    "one_line",
    "open_listener",
    "ssl_context",
]

log = logging.getLogger(__name__)

_KEYS_HINT = ("give keys (export REALTIME_MING_API_KEYS=key1,key2 and --set server.auth.api_keys_env="
              "REALTIME_MING_API_KEYS, or server.auth.api_keys_file), bind --host 127.0.0.1, or pass "
              "--allow-unauthenticated (server.auth.allow_unauthenticated: true) to serve without authentication")
_DOWNLOAD_HINT = "see the README's 'Serving the real checkpoint' for the download"


class StartupError(Exception):
    """The server cannot start as configured; the message is one line for the operator."""


def one_line(text: object) -> str:
    """`text` with its line breaks and runs of spaces folded into single spaces."""
    return " ".join(str(text).split())


def fail_start(message: object) -> int:
    """Print `message` as the one stderr line of a failed start (`realtime-ming: …`); -> exit status 2."""
    print(f"realtime-ming: {one_line(message)}", file=sys.stderr, flush=True)
    return 2


def prepare(cfg: ServerConfig) -> ServerConfig:
    """`cfg` with its API keys read, checked against this machine (raises StartupError, one line).

    Light: runs before torch and the model modules are imported, so a bad start fails in a moment.
    """
    from .config import ConfigError, resolve_api_keys

    try:
        cfg = resolve_api_keys(cfg)
    except ConfigError as exc:
        raise StartupError(f"config error: {exc}") from exc
    check_config(cfg)
    return cfg


def check_config(cfg: ServerConfig) -> None:
    """Refuse, before anything loads, a config that cannot serve on this machine."""
    checkpoint = _check_model_folder(cfg.engine)
    _check_devices(cfg.engine)
    _check_voices(cfg, checkpoint)
    check_exposure(cfg, warn=False)
    ssl_context(cfg.server.tls)


# ---- the model folder -----------------------------------------------------------------------------
def _check_model_folder(engine: EngineConfig):
    """The parsed CheckpointConfig of `engine.model_path` after checking its files (None: no folder)."""
    if engine.model_path is None:
        return None
    from ..model.checkpoint_check import CheckpointProblem, check_checkpoint

    folder = Path(engine.model_path).expanduser()
    if not folder.exists():
        raise StartupError(f"--model-path {folder} does not exist: download inclusionAI/Ming-flash-omni-2.0 "
                           f"there ({_DOWNLOAD_HINT}), or leave --model-path out to serve the tiny demo model")
    if not folder.is_dir():
        raise StartupError(f"--model-path {folder} is a file, not a checkpoint folder: pass the folder that "
                           "holds config.json and talker/")
    if not any(folder.iterdir()):
        raise StartupError(f"--model-path {folder} is an empty folder: the checkpoint is not there ({_DOWNLOAD_HINT})")
    incomplete = f"--model-path {folder} is not a complete Ming-flash-omni-2.0 checkpoint"
    try:
        checkpoint = check_checkpoint(folder, weights=engine.weights == "checkpoint", tokenizer_path=engine.tokenizer_path)
    except CheckpointProblem as exc:
        raise StartupError(f"{incomplete}: {one_line(exc.cause)}" if exc.incomplete else one_line(exc.cause)) from exc
    _check_talker_tokenizer(engine, folder, incomplete)
    return checkpoint


def _check_talker_tokenizer(engine: EngineConfig, folder: Path, incomplete: str) -> None:
    if engine.talker_tokenizer_path is not None:
        talker = Path(engine.talker_tokenizer_path)
        talker = talker / "tokenizer.json" if talker.is_dir() else talker
        if not talker.is_file():
            raise StartupError(f"engine.talker_tokenizer_path: {talker} does not exist")
    elif not (folder / "talker" / "llm" / "tokenizer.json").is_file():
        raise StartupError(f"{incomplete}: talker/llm/tokenizer.json is missing (or pass engine.talker_tokenizer_path)")


# ---- devices -----------------------------------------------------------------------------------------
def _check_devices(engine: EngineConfig) -> None:
    import torch

    place = engine.placement
    names = (*place.thinker_devices, *place.talker_devices, place.talker_device, place.encoder_device, place.vae_device)
    cuda: list[torch.device] = []
    for name in names:
        try:
            device = torch.device(name)
        except (RuntimeError, TypeError):
            raise StartupError(f"engine.placement: {name!r} is not a device; use cpu or cuda:N") from None
        if device.type == "cuda":
            cuda.append(device)
        elif device.type != "cpu":
            raise StartupError(f"engine.placement: {name!r}: only cpu and cuda devices are supported")
    if not cuda:
        return
    where = ", ".join(sorted({f"cuda:{d.index or 0}" for d in cuda}))
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        raise StartupError(
            f"the config places the model on {where}, but this torch ({torch.__version__}) is a CPU-only build: "
            "install a CUDA build of torch (https://pytorch.org/get-started/locally/) on a GPU machine, or serve "
            "on CPU without a GPU config (the default, or configs/tiny-cpu.yaml)")
    count = torch.cuda.device_count()
    if count == 0:
        raise StartupError(f"the config places the model on {where}, but no CUDA GPU is visible to torch "
                           "(check nvidia-smi and CUDA_VISIBLE_DEVICES)")
    needed = max(d.index or 0 for d in cuda) + 1
    if needed > count:
        raise StartupError(f"the config's engine.placement uses {where} ({needed} GPUs), but {count} GPU(s) are "
                           f"visible: use a config for {count} GPU(s) from configs/ or change engine.placement")


# ---- voices ------------------------------------------------------------------------------------------
def _check_voices(cfg: ServerConfig, checkpoint) -> None:
    wanted = [(key, value) for key, value in (("session.voice", cfg.session.voice),
                                              ("engine.default_voice", cfg.engine.default_voice)) if value is not None]
    if not wanted:
        return
    voices = _known_voices(cfg.engine, checkpoint)
    for key, value in wanted:
        if voices and value not in voices:
            raise StartupError(f"{key}: unknown voice {value!r}; this model's voices are {', '.join(voices)}")


def _known_voices(engine: EngineConfig, checkpoint) -> list[str]:
    from ..model.checkpoint_check import checkpoint_voices

    try:
        return checkpoint_voices(checkpoint, engine.preset)
    except ValueError as exc:
        raise StartupError(f"engine.preset: {exc}") from exc


# ---- exposure and TLS ------------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    """True when `host` names only this machine (127.0.0.0/8, ::1, or a name resolving only there)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if not host:
        return False  # "" = every interface
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def check_exposure(cfg: ServerConfig, *, warn: bool = True) -> None:
    """Refuse a non-loopback listen address without API keys unless the operator opted in (then warn)."""
    host, auth = cfg.server.host, cfg.server.auth
    if auth.api_keys or is_loopback(host):
        return
    if not auth.allow_unauthenticated:
        raise StartupError(f"refusing to listen on {host or 'every interface'} (reachable from other machines) "
                           f"without API keys: {_KEYS_HINT}")
    if warn:
        log.warning("serving %s without authentication (allow_unauthenticated): anyone who can reach this port can "
                    "use the model", host or "every interface")


def ssl_context(tls: TlsConfig) -> ssl.SSLContext | None:
    """The server TLS context of `tls` (None when TLS is off); unreadable or mismatched files refuse."""
    if not tls.enabled:
        return None
    for key, path in (("certfile", tls.certfile), ("keyfile", tls.keyfile)):
        file = Path(path)
        if not file.is_file():
            raise StartupError(f"server.tls.{key}: {file} does not exist (--ssl-{key} takes a PEM file)")
        try:
            file.open("rb").close()
        except OSError as exc:
            raise StartupError(f"server.tls.{key}: cannot read {file}: {exc.strerror or exc}") from exc
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.certfile, tls.keyfile)
    except ssl.SSLError as exc:
        raise StartupError(f"server.tls: cannot use certificate {tls.certfile} with key {tls.keyfile} "
                           f"({exc.reason or exc}): give a PEM certificate chain and its matching private key") from exc
    return context


# ---- the listening socket ---------------------------------------------------------------------------
def open_listener(host: str, port: int, backlog: int = 511) -> socket.socket:
    """A non-blocking TCP socket bound to `host:port` and listening (IPv4 preferred for a name)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"--host {host}: cannot resolve it ({exc.strerror}); use an address such as "
                           "127.0.0.1 or 0.0.0.0") from exc
    family, kind, proto, _, address = sorted(infos, key=lambda info: info[0] != socket.AF_INET)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio: TIME_WAIT, never a live listener
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise StartupError(_bind_problem(host, port, exc)) from exc
    sock.setblocking(False)
    return sock


def _bind_problem(host: str, port: int, exc: OSError) -> str:
    where = f"{host or '*'}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} is already in use on {host or 'every interface'}: stop the other server or pick another --port"
    if exc.errno == errno.EACCES:
        return f"no permission to listen on {where} (ports below 1024 need privileges): pick --port 1024 or above"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"--host {host} is not an address of this machine: use 127.0.0.1, 0.0.0.0 or one of its interfaces"
    return f"cannot listen on {where}: {exc.strerror or exc}"


# ---- failures only loading can find -------------------------------------------------------------
def load_failure(exc: BaseException) -> str | None:
    """One line for an exception of the kinds a model load can meet on a valid config; None = a bug."""
    import torch

    from ..model.checkpoint_check import is_load_error

    if isinstance(exc, torch.OutOfMemoryError):
        return ("out of GPU memory loading the model: the config's engine.placement gives it too little GPU memory; "
                "use a config with more GPUs or free the GPUs (nvidia-smi)")
    if isinstance(exc, MemoryError):
        return "out of host memory loading the model: it needs more RAM than this machine has free"
    if is_load_error(exc):
        return f"cannot load the model: {one_line(exc)}"
    if isinstance(exc, OSError):
        return f"cannot read the model files: {one_line(exc)}"
    return None
