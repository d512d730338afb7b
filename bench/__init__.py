"""TTFA benchmark: real-time paced spoken turns against any OpenAI-Realtime (GA) `/v1/realtime` server.

`python -m bench --url ws://127.0.0.1:8000/v1/realtime -c 1,2,4` (or `realtime-ming bench ...`)
sweeps concurrent sessions and writes results.json, summary.md and PNG plots. Importing this
package is cheap: the run modules load only when a run starts.
"""

from .cli import add_arguments, main, run

__all__ = ["add_arguments", "main", "run"]
