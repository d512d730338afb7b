"""TTFA benchmark: real-time paced spoken turns against any OpenAI-Realtime (GA) `/v1/realtime` server.

`realtime-ming bench --url ws://127.0.0.1:8000/v1/realtime -c 1,2,4` (or `python -m realtime_ming.bench`)
sweeps concurrent sessions and writes results.json, summary.md and PNG plots (with matplotlib: the `bench`
extra). It ships with the package, so an installed wheel measures its own deployment. Importing this package
is cheap: the run modules load only when a run starts. It imports nothing else of realtime_ming.
"""

from .cli import add_arguments, main, run

__all__ = ["add_arguments", "main", "run"]
