"""bench/write_checkpoint.py and bench/cold_start.py on CPU: the writer's files are valid safetensors in the
release's layout (keys and shapes from the manifest, shards of equal size, an index that names them), its configs
and stand-in tokenizers load as a checkpoint, and the cold-start runner measures a real server start (the
embedded tiny model served from a checkpoint folder)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from bench import write_checkpoint as wc
from conftest import fixture_tokenizers
from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.loader import checkpoint_keys
from realtime_ming.model.ming import build_ming
from realtime_ming.model.tokenizer import resolve_tokenizer

REPO = Path(__file__).resolve().parent.parent


def test_root_keys_split_into_equal_shards_in_manifest_order():
    tensors = wc.root_tensors()
    parts = wc.split_shards(tensors, 42)
    assert len(parts) == 42 and [t for part in parts for t in part] == tensors
    sizes = [sum(wc._numel(s) for _, s in part) * 2 for part in parts]
    assert sum(sizes) == 208_502_893_536 and max(sizes) < 1.3 * sum(sizes) / 42


def test_layers_keep_the_first_decoder_layers_whole_and_every_other_tensor():
    """`--layers K`: the thinker's layers 0..K-1 with all their tensors, none from K on, nothing else dropped."""
    full = wc.root_tensors()
    kept = wc.keep_layers(full, 6)
    layer = lambda key: int(key.split(".")[3]) if key.startswith("model.model.layers.") else None  # noqa: E731
    assert {layer(k) for k, _ in kept} - {None} == set(range(6))
    assert [t for t in full if layer(t[0]) is None or layer(t[0]) < 6] == kept
    assert sum(layer(k) == 5 for k, _ in kept) == sum(layer(k) == 5 for k, _ in full) > 700  # a MoE layer, whole
    assert wc.keep_layers(full, None) is full


def test_layer_count_written_into_the_config_builds_a_model_of_exactly_the_kept_keys(tmp_path):
    """The K-layer config's model (built on meta) wants exactly the K-layer checkpoint's keys and shapes."""
    wc.write_configs(tmp_path, 6)
    ck = load_checkpoint_config(tmp_path)
    assert ck.thinker.num_hidden_layers == 6 and ck.thinker.num_experts == 256
    wanted = {key: tuple(shape) for key, shape in checkpoint_keys(build_ming(ck.ming, weights="meta")).items()}
    assert wanted == dict(wc.keep_layers(wc.root_tensors(), 6))
    with pytest.raises(SystemExit):
        wc.write_configs(tmp_path / "bad", 33)


def test_written_file_is_valid_safetensors(tmp_path):
    tensors = [("a.weight", (3, 5)), ("b.bias", (7,)), ("c.big", (1000, 300))]
    path = tmp_path / "x.safetensors"
    size = wc.write_safetensors(path, tensors, wc.Pool())
    assert path.stat().st_size == size
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == sorted(k for k, _ in tensors)
        for key, shape in tensors:
            t = f.get_tensor(key)
            assert tuple(t.shape) == shape and str(t.dtype) == "torch.bfloat16" and t.isfinite().all()
            assert 0.005 < float(t.float().std()) < 0.05 or t.numel() < 10


def test_written_configs_and_tokenizers_load_as_a_checkpoint(tmp_path):
    wc.write_configs(tmp_path)
    ck = load_checkpoint_config(tmp_path)
    assert ck.thinker.num_experts == 256 and ck.talker.llm is not None
    resolve_tokenizer(tmp_path).check_config(ck.thinker)
    assert (tmp_path / "talker" / "llm" / "tokenizer.json").is_file()


@pytest.mark.slow
def test_cold_start_runner_measures_a_server_start(fixture_root, tmp_path):
    """The runner starts a real server from a checkpoint folder (the fixture set, CPU), sees it ready, and
    records time to ready, the checkpoint's size and the process tree's peak RSS."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(fixture_root, ckpt, ignore=shutil.ignore_patterns("cases"))
    thinker_tok, talker_tok = fixture_tokenizers(fixture_root)
    shutil.copyfile(thinker_tok, ckpt / "tokenizer.json")
    shutil.copyfile(talker_tok, ckpt / "talker" / "llm" / "tokenizer.json")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "bench.cold_start", "--config", str(REPO / "configs" / "tiny-cpu.yaml"),
                           "--model-path", str(ckpt), "--out", str(out), "--port", "8797", "--timeout-s", "240"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads((out / "cold_start.json").read_text())
    assert res["ready"] and res["seconds_to_ready"] > 0 and res["checkpoint_GB"] > 0
    assert res["peak_host_rss_GB"] > 0.05
