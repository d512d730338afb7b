"""bench/step_ops.py: the engine step's torch ops counted by the engine line that issued them (issue 45)."""

from __future__ import annotations

import pytest

from bench.step_ops import run


@pytest.mark.slow
def test_step_ops_counts_the_talkers_row_work_and_uploads_apart_from_graphed_work():
    steps, counter = run(turns=4, streams=2, stagger=2)
    assert steps > 0
    eager = {(site.split(":")[0], op) for site, op in counter.eager}
    assert ("talker_rows.py", "fill_") in eager  # a fresh stream's VAE row reset
    assert ("thinker_decode.py", "upload") in eager  # the decode step's one packed upload
    assert not any(site.startswith("?") for site, _ in counter.eager)  # every op traced to an engine line
    # the model's forward passes (graphed on a GPU) are not counted as the host's eager launches
    assert not any(op == "mm" for _, op in counter.eager)
    assert sum(counter.graphed.values()) > sum(counter.eager.values())
