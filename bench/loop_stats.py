"""The talker loops' running totals (`TalkerDriver.stats`: a talker process's `TalkerLoop.stats`) turned into a
window's figures, for the benches that run the talker in processes of its own."""

from __future__ import annotations

from collections import defaultdict

from realtime_ming.engine.talker_process import ProcessTalker

__all__ = ["LOOP_HEADER", "loop_members", "loop_rates", "loop_row", "loop_totals"]

LOOP_HEADER = ("| launches/s | ms in launch | ms in finish | idle share | rows per step | jobs/s | ms to start a job |",
               "|---|---|---|---|---|---|---|")


def loop_members(talker) -> list:
    """The members of a talker (a pool's replicas, or itself) that keep loop totals; [] when the caller steps it."""
    return [m for m in getattr(talker, "members", [talker]) if isinstance(m, ProcessTalker)]


def loop_totals(members: list) -> tuple[dict, int] | None:
    """The members' running totals summed, and how many members (None: no member keeps totals)."""
    if not members:
        return None
    total: dict = defaultdict(float)
    for member in members:
        for key, value in (member.stats() or {}).items():
            total[key] += value
    return dict(total), len(members)


def loop_rates(before: tuple[dict, int] | None, after: tuple[dict, int] | None, wall: float) -> dict:
    """A window's figures from the totals before and after it: per member (replica) but jobs/s, which is of all."""
    if before is None or after is None:
        return {}
    d = {k: after[0].get(k, 0) - before[0].get(k, 0) for k in after[0]}
    n, launches = after[1], max(1, d.get("launches", 0))
    return {"launches_per_s": d.get("launches", 0) / wall / n, "launch_ms": 1000 * d.get("launch_s", 0) / launches,
            "finish_ms": 1000 * d.get("finish_s", 0) / launches, "idle": d.get("idle_s", 0) / wall / n,
            "rows_per_step": d.get("rows", 0) / max(1, d.get("steps", 0)), "jobs_per_s": d.get("jobs", 0) / wall,
            "admit_ms_per_job": 1000 * d.get("admit_s", 0) / max(1, d.get("jobs", 0))}


def loop_row(t: dict) -> str:
    """`loop_rates`' figures as the cells of a LOOP_HEADER row (no leading or trailing bar)."""
    return (f"{t['launches_per_s']:.1f} | {t['launch_ms']:.2f} | {t['finish_ms']:.2f} | {t['idle']:.2f} | "
            f"{t['rows_per_step']:.1f} | {t['jobs_per_s']:.1f} | {t['admit_ms_per_job']:.2f}")
