"""Attack-suite drivers against a running realtime-ming (or any GA Realtime) server.

`python -m bench.attack --url ws://host:port/v1/realtime <attack> ...` with attack one of flood, barge-in, soak,
long-session, voices, http-bodies, image, drain, or all (each at a moderate size, the drain last); each prints a
JSON report and exits 0 when its acceptance holds, 1 otherwise. The CI tests (tests/test_attack.py) run the same
coroutines at small sizes against an in-process server.
"""
