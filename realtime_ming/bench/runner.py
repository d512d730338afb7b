"""The sweep: for every concurrency level (and round), open N sessions per target and collect samples.

Two targets are interleaved A, B, B, A, ... per level so slow drift (thermal, other load) hits
both. Returns one JSON-ready results object: config, client and server info, every sample,
summaries per target and level, and the comparison ratios.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import platform
import random
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .client import BenchSession, PlannedTurn
from .config import BenchConfig, Target, http_base
from .metrics import compare, summarise, turn_sample
from .trace import TurnTrace, clock
from .turns import SpokenTurn

__all__ = ["RESULTS_SCHEMA", "client_info", "plan_session", "run_benchmark", "server_info"]

log = logging.getLogger(__name__)

RESULTS_SCHEMA = "realtime-ming-bench/1"
_HTTP_TIMEOUT_S = 10.0


def _get_json(url: str, api_key: str | None) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_S) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


async def server_info(target: Target) -> dict[str, Any]:
    """`/v1/models` and `/health` of the target (an `error` entry where a server has none)."""
    base = http_base(target.url)
    models, health = await asyncio.gather(
        asyncio.to_thread(_get_json, f"{base}/v1/models", target.api_key),
        asyncio.to_thread(_get_json, f"{base}/health", target.api_key),
    )
    return {"url": target.url, "models": models, "health": health}


def _package_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("realtime-ming")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return None


def client_info() -> dict[str, Any]:
    """Where the benchmark ran: host, Python, platform, the package version, and the commit when the package
    runs from a git checkout (not from an installed wheel)."""
    import websockets

    root = Path(__file__).resolve().parents[2]  # realtime_ming/bench/runner.py -> the checkout's root
    try:
        if not (root / ".git").exists() or not (root / "pyproject.toml").is_file():
            raise OSError("not a source checkout")
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True,
                                    text=True, timeout=5, check=True).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    cpu_model = None
    try:
        cpu_model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                          if line.startswith("model name")), None)
    except OSError:
        pass
    return {
        "host": platform.node(),
        "cpu_model": cpu_model,
        "num_cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "websockets": websockets.__version__,
        "realtime_ming": _package_version(),
        "git_commit": commit,
        "git_dirty": dirty,
    }


def plan_session(cfg: BenchConfig, turns: Sequence[SpokenTurn], session_index: int, round_index: int) -> list[PlannedTurn]:
    """Warmups then measured turns, cycling through `turns` from a per-session offset.

    In barge-in mode each turn is interrupted by the next utterance of the cycle.
    """
    plan = []
    start = session_index + round_index * cfg.num_turns
    for k in range(cfg.num_warmup_turns + cfg.num_turns):
        turn = turns[(start + k) % len(turns)]
        barge = turns[(start + k + 1) % len(turns)] if cfg.barge_in else None
        plan.append(PlannedTurn(turn, is_warmup=k < cfg.num_warmup_turns, barge=barge))
    return plan


async def _run_level(cfg: BenchConfig, target: Target, turns: Sequence[SpokenTurn], concurrency: int,
                     round_index: int, on_turn: Callable[[TurnTrace], None]) -> tuple[dict[str, Any], list[BenchSession]]:
    rng = random.Random(f"{cfg.seed}/{target.name}/{concurrency}/{round_index}")
    sessions = [BenchSession(cfg, target, i, plan_session(cfg, turns, i, round_index), on_turn)
                for i in range(concurrency)]

    async def staggered(session: BenchSession, offset_s: float) -> list[TurnTrace]:
        await asyncio.sleep(offset_s)  # scenario: users do not all start at once
        return await session.run()

    started = clock()
    offsets = [0.0] + [rng.uniform(0.0, cfg.stagger_s) for _ in range(concurrency - 1)]
    traces = await asyncio.gather(*(staggered(s, o) for s, o in zip(sessions, offsets)))
    wall_s = clock() - started
    measured = [t for session_traces in traces for t in session_traces if not t.is_warmup]
    starts = [t.speech_start_at for t in measured if t.speech_start_at is not None]
    ends = [r.done_at for t in measured for r in t.responses if r.done_at is not None]
    samples = [turn_sample(t, cfg.sample_rate_hz, allow_silent=cfg.allow_silent)
               for session_traces in traces for t in session_traces]
    level = {
        "target": target.name,
        "concurrency": concurrency,
        "round": round_index,
        "wall_s": wall_s,
        # first measured speech start → last measured response end: the denominator of audio s / wall s
        "measured_wall_s": max(ends) - min(starts) if starts and ends else wall_s,
        "samples": samples,
    }
    return level, sessions


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="turn", disable=not enabled, dynamic_ncols=True)


async def run_benchmark(cfg: BenchConfig, turns: Sequence[SpokenTurn], command: str = "",
                        on_level: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the whole sweep and return the results object (see `report.write_results`).

    `on_level(partial)` after every finished level: the results so far, summarised over the concurrency
    levels already complete (a run stopped midway keeps what it measured)."""
    results: dict[str, Any] = {
        "schema": RESULTS_SCHEMA,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "config": cfg.to_json(),
        "client": client_info(),
        "turns": [t.describe() for t in turns],
        "targets": {t.name: await server_info(t) for t in cfg.targets},
        "levels": [],
    }
    per_level = cfg.num_warmup_turns + cfg.num_turns
    total = sum(c * per_level for c in cfg.concurrency) * cfg.num_rounds * len(cfg.targets)
    with _progress(total, cfg.show_progress) as bar:
        for concurrency in cfg.concurrency:
            for round_index in range(cfg.num_rounds):
                order = cfg.targets if round_index % 2 == 0 else tuple(reversed(cfg.targets))
                for target in order:
                    bar.set_description(f"{target.name} c={concurrency}")

                    def on_turn(trace: TurnTrace) -> None:
                        bar.update(1)
                        if trace.failure is not None:
                            bar.set_postfix_str(f"last failure: {trace.failure[:40]}")

                    level, sessions = await _run_level(cfg, target, turns, concurrency, round_index, on_turn)
                    results["levels"].append(level)
                    info = results["targets"][target.name]
                    if "session" not in info and sessions[0].session_echo is not None:
                        info["session"] = sessions[0].session_echo
                        info["timings_enabled"] = sessions[0].timings_enabled
            if on_level is not None:
                done = tuple(c for c in cfg.concurrency if any(lv["concurrency"] == c for lv in results["levels"]))
                on_level({**results, "levels": list(results["levels"]), "partial": True,
                          "summary": _summaries(cfg, results["levels"], done)})
    results["summary"] = _summaries(cfg, results["levels"])
    if cfg.is_comparison:
        base, other = (t.name for t in cfg.targets)
        results["comparison"] = {
            "base": base,
            "other": other,
            "ratios": {str(c): compare(results["summary"][base][str(c)], results["summary"][other][str(c)])
                       for c in cfg.concurrency},
        }
    return results


def _summaries(cfg: BenchConfig, levels: Sequence[dict[str, Any]],
               concurrency: Sequence[int] | None = None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for target in cfg.targets:
        out[target.name] = {}
        for c in cfg.concurrency if concurrency is None else concurrency:
            group = [lv for lv in levels if lv["target"] == target.name and lv["concurrency"] == c]
            samples = [s for lv in group for s in lv["samples"]]
            out[target.name][str(c)] = summarise(samples, sum(lv["measured_wall_s"] for lv in group))
    return out
