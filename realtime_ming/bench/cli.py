"""Command line of the benchmark: `realtime-ming bench ...` (or `python -m realtime_ming.bench ...`).

Options left unset keep the `BenchConfig` defaults (they live in the dataclass only). Exit code
0 when every measured turn succeeded, 1 when some failed (results are still written), 2 for a
bad configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import json
import logging
import shlex
import sys
from dataclasses import fields
from pathlib import Path

from .config import BenchConfig, Target, TurnMode

_PROG = "realtime-ming bench"

__all__ = ["add_arguments", "config_from_args", "main", "run"]

_DEFAULTS = {f.name: f.default for f in fields(BenchConfig)}
_SECRET_FLAGS = ("--api-key", "--compare-api-key")

# flag -> (BenchConfig field, type, help)
_OPTIONS = (
    ("--concurrency", "concurrency", lambda s: tuple(int(c) for c in s.split(",")), "comma-separated levels"),
    ("--turns", "num_turns", int, "measured turns per session"),
    ("--warmup", "num_warmup_turns", int, "warmup turns per session (excluded)"),
    ("--rounds", "num_rounds", int, "level runs per (target, concurrency); targets alternate A,B,B,A"),
    ("--mode", "mode", TurnMode, "vad: server VAD ends turns; manual: commit + response.create"),
    ("--barge-in-after-ms", "barge_in_after_ms", float, "barge in this long after the first audio delta"),
    ("--frame-ms", "frame_ms", int, "microphone frame per append"),
    ("--pause-s", "pause_s", float, "pause between a turn's end and the next turn"),
    ("--stagger-s", "stagger_s", float, "sessions start at random offsets in [0, this]"),
    ("--turn-timeout-s", "turn_timeout_s", float, "end of speech → responses done, else the turn fails"),
    ("--max-output-tokens", "max_output_tokens", int, "session max_output_tokens (default: the server's)"),
    ("--instructions", "instructions", str, "session instructions"),
    ("--voice", "voice", str, "session audio.output.voice"),
    ("--vad-silence-ms", "vad_silence_ms", int, "server_vad silence_duration_ms"),
    ("--vad-threshold", "vad_threshold", float, "server_vad threshold"),
    ("--wav-dir", "wav_dir", str, "extra turns: *.wav in this folder (a same-named .txt is the transcript)"),
    ("--turns-cache", "turns_cache_dir", str, "cache folder of the espeak-ng turns"),
    ("--max-turn-s", "max_turn_s", float, "skip utterances longer than this"),
    ("--silence-dbfs", "silence_dbfs", float, "below this a sample is silence (finds the end of speech)"),
    ("--seed", "seed", int, "seed of the session start offsets"),
    ("--out", "out_dir", str, "output folder (default: bench/out/run-<UTC time> under the current directory)"),
)


def _json_object(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to `parser` (used by `realtime-ming bench` and `python -m realtime_ming.bench`)."""
    target = parser.add_argument_group("target")
    target.add_argument("--url", required=True, help="ws(s)://host:port/v1/realtime of the server")
    target.add_argument("--name", default="A", help="label of the target (default: A)")
    target.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    target.add_argument("--model", help="?model= query value (when the URL has none)")
    target.add_argument("--session", type=_json_object, default={}, help="JSON merged into the GA session.update")
    compare = parser.add_argument_group("comparison (a second target, interleaved with the first)")
    compare.add_argument("--compare-url", help="second server (default: --url when other --compare-* are given)")
    compare.add_argument("--compare-name", default="B", help="label of the second target (default: B)")
    compare.add_argument("--compare-api-key")
    compare.add_argument("--compare-model")
    compare.add_argument("--compare-session", type=_json_object, help="session JSON of the second target")
    run = parser.add_argument_group("run")
    for flag, name, kind, text in _OPTIONS:
        default = _DEFAULTS[name]
        shown = default.value if isinstance(default, TurnMode) else default
        if isinstance(shown, tuple):
            shown = ",".join(map(str, shown))
        flags = (flag, "-c") if name == "concurrency" else (flag,)
        run.add_argument(*flags, dest=name, type=kind, metavar=name.upper(), help=f"{text} (default: {shown})")
    run.add_argument("--barge-in", action="store_true", help="speak the next utterance over each response")
    run.add_argument("--allow-silent", action="store_true",
                     help="a response without audio does not fail the turn (random-weight models)")
    run.add_argument("--no-default-turns", action="store_true", help="only the --wav-dir turns")
    run.add_argument("--no-timings", action="store_true", help="do not ask for realtime_ming timing events")
    run.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--log-level", default="WARNING", help="logging level (default: WARNING)")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The `BenchConfig` of parsed arguments; raises ValueError on a bad combination."""
    targets = [Target(args.name, args.url, args.api_key, args.model, args.session)]
    wants_compare = any(v is not None for v in (args.compare_url, args.compare_api_key, args.compare_model,
                                                args.compare_session))
    if wants_compare:
        targets.append(Target(
            args.compare_name,
            args.compare_url or args.url,
            args.compare_api_key if args.compare_api_key is not None else args.api_key,
            args.compare_model if args.compare_model is not None else args.model,
            args.compare_session if args.compare_session is not None else args.session,
        ))
    values = {name: getattr(args, name) for _, name, _, _ in _OPTIONS if getattr(args, name) is not None}
    if values.get("out_dir") is None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        values["out_dir"] = str(Path("bench") / "out" / f"run-{stamp}")  # in a checkout: git-ignored
    return BenchConfig(
        targets=tuple(targets),
        barge_in=args.barge_in,
        allow_silent=args.allow_silent,
        use_default_turns=not args.no_default_turns,
        timing_events=not args.no_timings,
        show_progress=not args.no_progress,
        **values,
    )


def _command_line() -> str:
    """The invoking command with API keys redacted."""
    prog = _PROG if sys.argv[0].endswith("__main__.py") else Path(sys.argv[0]).name
    argv = sys.argv[1:]
    out = []
    for i, arg in enumerate(argv):
        if i and argv[i - 1] in _SECRET_FLAGS:
            arg = "<redacted>"
        elif any(arg.startswith(f"{flag}=") for flag in _SECRET_FLAGS):
            arg = arg.split("=", 1)[0] + "=<redacted>"
        out.append(arg)
    return f"{prog} {shlex.join(out)}"


def _event_loop_factory():
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(args: argparse.Namespace) -> int:
    """Run the benchmark of parsed arguments; prints where the results went."""
    from .report import write_results
    from .runner import run_benchmark
    from .turns import load_turns

    try:
        cfg = config_from_args(args)
        turns = load_turns(use_default=cfg.use_default_turns, wav_dir=cfg.wav_dir, cache_dir=cfg.turns_cache_dir,
                           wire_rate_hz=cfg.sample_rate_hz, silence_dbfs=cfg.silence_dbfs, max_turn_s=cfg.max_turn_s)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    plots = not args.no_plots
    if plots and importlib.util.find_spec("matplotlib") is None:  # said before the run, not after it
        print("bench: matplotlib is not installed, so no plots (pip install 'realtime-ming[bench]')", file=sys.stderr)
        plots = False
    def checkpoint(partial: dict) -> None:  # a run killed midway keeps its finished levels (no plots: fast)
        write_results(partial, Path(cfg.out_dir), plots=False)

    with asyncio.Runner(loop_factory=_event_loop_factory()) as runner:
        results = runner.run(run_benchmark(cfg, turns, _command_line(), on_level=checkpoint))
    paths = write_results(results, Path(cfg.out_dir), plots=plots)
    table = [line for line in paths["markdown"].read_text().split("## Results", 1)[-1].split("\n## ", 1)[0].splitlines()
             if line.startswith("|")]
    print("\n".join(table))
    print(f"\nresults: {paths['json'].parent.resolve()}")
    failed = sum(not s["ok"] for lv in results["levels"] for s in lv["samples"] if not s["is_warmup"])
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m realtime_ming.bench`; returns the exit code."""
    parser = argparse.ArgumentParser(prog=_PROG, description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(args)
