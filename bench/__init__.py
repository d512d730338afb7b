"""Measurement scripts of the source checkout: server load, fuzzing, attacks, turn taking offline, GPU-lab tools.

The client-side TTFA benchmark ships with the package (`realtime_ming.bench`, `realtime-ming bench`);
`python -m bench` here is the same command.
"""
