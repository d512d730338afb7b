"""realtime-ming: an OpenAI-Realtime-compatible voice-agent server for Ming-flash-omni-2.0.

Options that name a config key (`--model-path`, `--host`, ...) are shorthands for `--set` and
win over the config file (explicit `--set` wins over both); unset options change nothing, so
defaults stay in the dataclasses. A configuration this machine cannot serve ends `serve` with one
line on stderr starting `realtime-ming:` and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from importlib import metadata

from ._exit import exit_now

__all__ = ["build_parser", "main", "serve_config", "serve_hooks"]

# `--flag` -> dotted config key it overrides.
_SERVE_SHORTHANDS = (
    ("--model-path", "engine.model_path", str, "model checkpoint folder (default: the embedded tiny model)"),
    ("--tokenizer", "engine.tokenizer_path", str, "tokenizer folder or file (default: from the checkpoint)"),
    ("--host", "server.host", str, "interface to listen on"),
    ("--port", "server.port", int, "TCP port (0 = any free port)"),
    ("--ssl-certfile", "server.tls.certfile", str, "PEM certificate chain: serve wss:// and https:// (with --ssl-keyfile)"),
    ("--ssl-keyfile", "server.tls.keyfile", str, "PEM private key of --ssl-certfile"),
)


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML or JSON config (see configs/)")
    for flag, key, kind, text in _SERVE_SHORTHANDS:
        parser.add_argument(flag, type=kind, metavar="VALUE", help=f"{text}; same as --set {key}=VALUE")
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve a non-loopback --host without API keys (logs a warning); "
             "same as --set server.auth.allow_unauthenticated=true",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one config key, e.g. --set session.vad.backend=webrtc (repeatable)",
    )
    parser.add_argument(
        "--hook",
        dest="hooks",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="tests and benchmarks only: an engine hook (engine/hooks.py), e.g. --hook forced_reply='Sure.' "
             "(the models still compute; a hook replaces their result); not a config key (repeatable)",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the full effective config (YAML, API keys redacted) once the start-up checks pass, and exit",
    )
    parser.add_argument("--log-level", default="INFO",
                        help="logging level (default: INFO: a short summary; DEBUG adds the full effective config)")


def serve_config(args: argparse.Namespace):
    """The `ServerConfig` of parsed `serve` arguments (file, then shorthands, then --set)."""
    from .server.config import load_serve_config

    overrides = []
    for flag, key, _, _ in _SERVE_SHORTHANDS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            # JSON is valid YAML: the value arrives verbatim (a path with ': ' stays a string).
            overrides.append(f"{key}={json.dumps(value)}")
    if args.allow_unauthenticated:
        overrides.append("server.auth.allow_unauthenticated=true")
    return load_serve_config(args.config, overrides + list(args.overrides))


def serve_hooks(args: argparse.Namespace):
    """The `EngineHooks` of parsed `serve --hook` arguments (None without any); ValueError names a bad one."""
    from .engine.hooks import parse_hooks

    return parse_hooks(args.hooks)


def _fail(message: object) -> int:
    """Print `message` as the one stderr line of a failed start; the exit status is 2."""
    from .server.startup import fail_start

    return fail_start(message)


def _run_serve(args: argparse.Namespace) -> int:
    from .server.config import ConfigError
    from .server.config_report import config_yaml
    from .server.startup import StartupError, prepare

    try:
        cfg = serve_config(args)
        hooks = serve_hooks(args)
        if hooks is not None:
            hooks.check(cfg.engine)
    except (ConfigError, ValueError) as exc:
        return _fail(f"config error: {exc}")
    try:
        checked = prepare(cfg)  # before torch is imported: a bad start fails in a moment
        if args.print_config:
            print(config_yaml(checked))
            return 0
        if cfg.server.frontend_processes > 1:  # the WebSockets in their own processes, the engine in this one
            from .server.frontends import run_frontends

            code = run_frontends(cfg, hooks)
        else:
            from .server.run import run_server

            code = run_server(cfg, hooks=hooks)
    except StartupError as exc:
        return _fail(exc)
    exit_now(code)  # once shut down: finalization could abort a clean exit (see `exit_now`)


def _add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    from .bench import add_arguments

    add_arguments(parser)


def _run_bench(args: argparse.Namespace) -> int:
    from .bench import run

    return run(args)


def _cluster_cli():
    from .cluster import cli

    return cli


# name -> (help, add_arguments, run), one subcommand each.
_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "serve": ("run the /v1/realtime server", _add_serve_arguments, _run_serve),
    "serve-cluster": ("run /v1/realtime on Ray Serve: many replicas, one endpoint (pip install 'realtime-ming[cluster]')",
                      lambda parser: _cluster_cli().add_arguments(parser), lambda args: _cluster_cli().run(args)),
    "bench": ("TTFA benchmark: real-time paced spoken turns against any /v1/realtime server (plots: pip install "
              "'realtime-ming[bench]')",
              _add_bench_arguments, _run_bench),
}


def build_parser() -> argparse.ArgumentParser:
    """The `realtime-ming` parser: `--version` and one subparser per subcommand."""
    parser = argparse.ArgumentParser(prog="realtime-ming", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (text, add_arguments, run) in _COMMANDS.items():
        command = sub.add_parser(name, help=text, description=text)
        add_arguments(command)
        command.set_defaults(run=run)
    return parser


def _version() -> str:
    try:
        return metadata.version("realtime-ming")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


_TORCH_HINT = ("pip install torch==2.13.0 (the CPU-only build: add --index-url https://download.pytorch.org/whl/cpu; "
               "a GPU machine: the CUDA build of torch 2.11-2.14), then run again")


def _missing_package(exc: ModuleNotFoundError) -> int:
    """One stderr line for a dependency that is not installed (exit status 2), instead of a traceback."""
    name = (exc.name or "?").split(".")[0]
    hint = _TORCH_HINT if name == "torch" else "reinstall realtime-ming (pip install realtime-ming), which declares it"
    print(f"realtime-ming: the Python package '{name}' is not installed in this environment ({sys.executable}): "
          f"{hint}", file=sys.stderr, flush=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `realtime-ming` script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", "INFO")
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.run(args)
    except ModuleNotFoundError as exc:  # torch is installed on its own (README), so it can be missing
        return _missing_package(exc)
    except KeyboardInterrupt:  # Ctrl-C while loading: no traceback
        print("realtime-ming: interrupted", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
