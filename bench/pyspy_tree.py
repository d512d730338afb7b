"""Where a thread's time goes, from a py-spy raw profile (`py-spy record --threads --format raw`, gzipped or not).

    python -m bench.pyspy_tree PROFILE THREAD ANCHOR [--depth 6] [--min-pct 1.5]

THREAD: a substring of the thread's name (`realtime-ming-talker-0`); ANCHOR: a function name prefix
(`TalkerLoop._step`): only samples whose stack passes through it count, and the tree below it is printed with
each node's share of those samples (files shortened to their base names). Run py-spy with `--idle` for wall time
(waits included) or `--gil` for the time the thread holds the interpreter lock. bench/gpu_pyspy.sh records both.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
import sys

_FILE = re.compile(r" \((?:.*/)?([^/]*)\)$")


def load(path: str, thread: str, anchor: str) -> tuple[collections.Counter, int, int]:
    """(tree: path tuple below the anchor -> samples, samples of the thread, samples through the anchor)."""
    tree: collections.Counter = collections.Counter()
    in_thread = through = 0
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            frames, n = stack.split(";"), int(count)
            if thread not in frames[0]:
                continue
            in_thread += n
            at = next((i for i, fr in enumerate(frames) if fr.startswith(anchor)), None)
            if at is None:
                continue
            through += n
            below = tuple(_FILE.sub(r" (\1)", fr) for fr in frames[at + 1:])
            for d in range(len(below) + 1):
                tree[below[:d]] += n
    return tree, in_thread, through


def render(tree: collections.Counter, total: int, depth: int, min_pct: float) -> list[str]:
    children = collections.defaultdict(list)
    for path, n in tree.items():
        if path:
            children[path[:-1]].append((path, n))
    lines = []

    def walk(prefix: tuple, level: int) -> None:
        for path, n in sorted(children[prefix], key=lambda kv: -kv[1]):
            if 100 * n / total < min_pct or level >= depth:
                continue
            lines.append(f"{'  ' * level}{100 * n / total:5.1f}% {path[-1]}")
            walk(path, level + 1)

    walk((), 0)
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile")
    p.add_argument("thread")
    p.add_argument("anchor")
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--min-pct", type=float, default=1.5)
    args = p.parse_args(argv)
    tree, in_thread, through = load(args.profile, args.thread, args.anchor)
    if not through:
        print(f"no sample of a thread named like {args.thread!r} passes through {args.anchor!r} "
              f"({in_thread} samples of that thread)", file=sys.stderr)
        return 1
    print(f"{args.thread}: {in_thread} samples, {through} through {args.anchor} (100 %)")
    print("\n".join(render(tree, through, args.depth, args.min_pct)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
