"""bench/tp_bench.py on CPU: gloo TP=2 on the tiny preset writes its report and decodes TP=1's greedy tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from realtime_ming.model.loader import init_dummy
from realtime_ming.model.presets import tiny_config
from realtime_ming.model.thinker import Thinker
from realtime_ming.model.tiny_tokenizer import (
    TINY_VOCAB_SIZE,
    tiny_talker_special_ids,
    tiny_thinker_special_ids,
)

pytestmark = pytest.mark.slow  # a bench script in a subprocess with gloo TP=2

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "tp_bench.py"
BATCHES = (1, 2)
CHECK_TOKENS = 4


def _write_checkpoint(folder: Path) -> None:
    """The tiny preset's thinker with seeded dummy weights, saved under its checkpoint keys (experts unstacked)."""
    cfg = tiny_config(tiny_thinker_special_ids(), tiny_talker_special_ids(), TINY_VOCAB_SIZE).thinker
    with torch.device("meta"):
        thinker = Thinker(cfg)
    init_dummy(thinker, seed=7)
    inter = cfg.moe_intermediate_size
    tensors = {}
    for name, p in thinker.named_parameters():
        base, _, leaf = name.rpartition(".")
        if leaf == "experts_gate_up":
            for e in range(p.shape[0]):
                tensors[f"model.{base}.experts.{e}.gate_proj.weight"] = p[e, :inter]
                tensors[f"model.{base}.experts.{e}.up_proj.weight"] = p[e, inter:]
        elif leaf == "experts_down":
            for e in range(p.shape[0]):
                tensors[f"model.{base}.experts.{e}.down_proj.weight"] = p[e]
        else:
            tensors[f"model.{name}"] = p
    folder.mkdir()
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))


def _run(tp: int, checkpoint: Path, out: Path) -> dict:
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--preset", "tiny", "--tp", str(tp),
           "--checkpoint", str(checkpoint), "--out", str(out), "--batches", ",".join(map(str, BATCHES)),
           "--steps", "2", "--eager-steps", "2", "--reps", "1", "--check-tokens", str(CHECK_TOKENS),
           "--kv-len", "192"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "tp_bench.json").read_text())


def test_tp_bench_tp2_gloo_matches_tp1(tmp_path):
    """TP=2 (gloo) writes JSON + markdown with every stage, and its greedy tokens equal TP=1's exactly."""
    ckpt = tmp_path / "ckpt"
    _write_checkpoint(ckpt)
    one = _run(1, ckpt, tmp_path / "tp1")
    two = _run(2, ckpt, tmp_path / "tp2")
    assert (tmp_path / "tp2" / "tp_bench.md").read_text().startswith("# Thinker tensor-parallel benchmark, TP=2")
    assert two["meta"]["tp"] == 2 and two["meta"]["backend"] == "gloo"
    assert sorted(two["decode"]) == [str(b) for b in BATCHES]
    assert all(row["eager_ms"] > 0 for row in two["decode"].values())
    assert sorted(two["collectives_ms"]) == [str(b) for b in BATCHES]
    assert sorted(two["prefill"]) == ["B1", "B2"]
    assert [m["rank"] for m in two["memory"]] == [0, 1]
    assert len(two["greedy"]["eager"]) == CHECK_TOKENS
    assert two["greedy"]["first_token"] == one["greedy"]["first_token"]
    assert two["greedy"]["eager"] == one["greedy"]["eager"]
    assert two["greedy"]["graphed"] == one["greedy"]["graphed"]
