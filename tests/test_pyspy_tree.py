"""bench/pyspy_tree.py: a thread's samples below an anchor function, as a tree of shares."""

from __future__ import annotations

import gzip

from bench import pyspy_tree

RAW = """\
thread (1): realtime-ming-talker-0;run (a/loop.py:1);step (a/loop.py:9);wait (b/x.py:3) 6
thread (1): realtime-ming-talker-0;run (a/loop.py:1);step (a/loop.py:9);vae (b/y.py:4) 2
thread (1): realtime-ming-talker-0;run (a/loop.py:1);idle (a/loop.py:2) 90
thread (2): realtime-ming-engine;run (a/loop.py:1);step (a/loop.py:9);wait (b/x.py:3) 50
"""


def test_tree_counts_only_the_thread_below_the_anchor(tmp_path, capsys):
    path = tmp_path / "prof.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write(RAW)
    tree, in_thread, through = pyspy_tree.load(str(path), "talker-0", "step")
    assert (in_thread, through) == (98, 8)
    assert tree[("wait (x.py:3)",)] == 6 and tree[()] == 8
    assert pyspy_tree.render(tree, through, depth=4, min_pct=30) == [" 75.0% wait (x.py:3)"]
    assert pyspy_tree.main([str(path), "talker-0", "step"]) == 0
    assert "25.0% vae (y.py:4)" in capsys.readouterr().out
    assert pyspy_tree.main([str(path), "talker-0", "nowhere"]) == 1
