"""Attack-suite drivers against a running realtime-ming (or any GA Realtime) server.

`python -m bench.attack <flood|barge-in|soak|long-session> --url ws://host:port/v1/realtime ...`;
each prints a JSON report and exits 0 when its acceptance holds, 1 otherwise. The CI tests run the
same coroutines at small sizes against an in-process server.
"""
