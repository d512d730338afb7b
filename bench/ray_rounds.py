"""Per-round TTFA_server p50 of two targets, and the difference first target - second target in each round: shows how
much of an overhead is the machine's noise. Either one interleaved two-target run (`python -m bench --rounds N
--compare-url ...`), or several one-target runs taking turns (one file per run; a target's k-th file is its round k):

    python bench/ray_rounds.py bench/out/ray-direct/results.json
    python bench/ray_rounds.py OUT/overhead/ray-r*/bench/results.json OUT/overhead/plain-r*/bench/results.json
"""

from __future__ import annotations

import json
import statistics
import sys


def main(paths: list[str]) -> None:
    targets: list[str] = []
    rows: dict[int, dict[tuple[int, int], dict[str, float]]] = {}
    runs: dict[str, int] = {}  # target -> how many files named it so far
    for path in paths:
        data = json.load(open(path))
        named = list(data["targets"])
        targets += [t for t in named if t not in targets]
        for t in named:
            runs[t] = runs.get(t, 0) + 1
        for level in data["levels"]:
            # the turns the bench's percentiles count (an utterance split into two responses is not one)
            values = [s["ttfa_server_s"] for s in level["samples"]
                      if not s["is_warmup"] and s.get("ok", True) and s.get("ttfa_server_s") is not None]
            if values:
                key = (runs[level["target"]], level["round"])
                rows.setdefault(level["concurrency"], {}).setdefault(key, {})[level["target"]] = (
                    statistics.median(values) * 1000.0)
    if len(targets) < 2:
        raise SystemExit(f"need two targets, found {targets}")
    first, second = targets[:2]
    for c, rounds in sorted(rows.items()):
        diffs = []
        for index, (_, by_target) in enumerate(sorted(rounds.items()), 1):
            if first not in by_target or second not in by_target:
                print(f"c={c} round {index}: no measured turn for {first if first not in by_target else second}")
                continue
            diffs.append(by_target[first] - by_target[second])
            print(f"c={c} round {index}: {first} {by_target[first]:.0f}  {second} {by_target[second]:.0f}  "
                  f"difference {diffs[-1]:+.0f} ms")
        if diffs:
            print(f"c={c}: median of the per-round differences {statistics.median(diffs):+.0f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
