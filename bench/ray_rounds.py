"""Per-round TTFA_server p50 of an interleaved two-target bench run (`python -m bench --rounds N --compare-url ...`),
and the difference first target - second target in each round: shows how much of an overhead is the machine's noise.

    python bench/ray_rounds.py bench/out/ray-direct/results.json
"""

from __future__ import annotations

import json
import statistics
import sys


def main(path: str) -> None:
    data = json.load(open(path))
    first, second = list(data["targets"])[:2]
    rows: dict[int, dict[int, dict[str, float]]] = {}
    for level in data["levels"]:
        # the turns the bench's percentiles count (an utterance split into two responses is not one)
        values = [s["ttfa_server_s"] for s in level["samples"]
                  if not s["is_warmup"] and s.get("ok", True) and s.get("ttfa_server_s") is not None]
        if values:
            rows.setdefault(level["concurrency"], {}).setdefault(level["round"], {})[level["target"]] = (
                statistics.median(values) * 1000.0)
    for c, rounds in sorted(rows.items()):
        diffs = []
        for r, by_target in sorted(rounds.items()):
            if first not in by_target or second not in by_target:
                print(f"c={c} round {r}: no measured turn for {first if first not in by_target else second}")
                continue
            diffs.append(by_target[first] - by_target[second])
            print(f"c={c} round {r}: {first} {by_target[first]:.0f}  {second} {by_target[second]:.0f}  "
                  f"difference {diffs[-1]:+.0f} ms")
        if diffs:
            print(f"c={c}: median of the per-round differences {statistics.median(diffs):+.0f} ms")


if __name__ == "__main__":
    main(sys.argv[1])
