"""Write a full-size Ming-flash-omni-2.0 checkpoint of random bf16 weights in the release's layout (cold-start tests).

    python -m bench.write_checkpoint OUT_DIR [--shards 42] [--threads 8] [--layers K]

Root: every key and shape of the manifest (tests/fixtures/ming_flash_omni_2_0_manifest.json; 25131 tensors, 104.25 B
parameters, 208.5 GB in bf16) in `--shards` files model-000NN-of-000MM.safetensors (the release has 42; which key is
in which of its files is not known, so consecutive manifest keys fill files of equal size) + the index; the talker
(manifest keys) and the AudioVAE (the preset's module: the manifest lists only patterns) in talker/; the preset's
configs, stand-in tokenizers on the real special ids (engine/models.standin_tokenizers) and voice list. Values: a
128 MiB pool of N(0, 0.02²) bf16 read at a moving offset (weights need not be distinct to time a load). Files are
written by `--threads` writers in parallel; prints GB written and GB/s. Needs ~211 GB of free disk.

`--layers K` keeps only the thinker's first K of its 32 decoder layers (config.json says K; every other tensor whole,
every tensor at its full shape, shards of the full checkpoint's size): a cold start that fits a smaller disk, whose
per-layer cost scales to the whole model (bench/cold_start.sh's LAYERS). A K-layer checkpoint is not the model.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.memory_budget import MANIFEST, root_tensors  # noqa: E402
from realtime_ming.engine.models import standin_tokenizers  # noqa: E402
from realtime_ming.model.loader import checkpoint_keys  # noqa: E402
from realtime_ming.model.presets import preset_config, preset_dir  # noqa: E402
from realtime_ming.model.vae import AudioVAE  # noqa: E402

PRESET = "ming-flash-omni-2.0"
POOL_BYTES = 128 << 20
BF16 = 2


class Pool:
    """Random bf16 bytes handed out as consecutive slices of one buffer (wrapping around)."""

    def __init__(self, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        values = (torch.randn(POOL_BYTES // BF16, generator=gen) * 0.02).to(torch.bfloat16)
        self.data = memoryview(values.view(torch.uint8).numpy())

    def write(self, f, nbytes: int, start: int) -> None:
        at = start % len(self.data)
        at -= at % BF16
        while nbytes:
            n = min(nbytes, len(self.data) - at)
            f.write(self.data[at:at + n])
            nbytes -= n
            at = 0


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def write_safetensors(path: Path, tensors: list[tuple[str, tuple[int, ...]]], pool: Pool) -> int:
    """One safetensors file of bf16 tensors (key, shape) filled from the pool; returns its bytes."""
    header, offset = {}, 0
    for key, shape in tensors:
        nbytes = _numel(shape) * BF16
        header[key] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data start 8-byte aligned
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb", buffering=16 << 20) as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for i, (key, shape) in enumerate(tensors):
            pool.write(f, _numel(shape) * BF16, start=i * 7919 * 4096)
    return 8 + len(blob) + offset


def split_shards(tensors: list[tuple[str, tuple[int, ...]]], shards: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Consecutive tensors into `shards` files of about equal bytes."""
    total = sum(_numel(s) for _, s in tensors) * BF16
    out, current, size = [], [], 0
    for key, shape in tensors:
        current.append((key, shape))
        size += _numel(shape) * BF16
        if size >= total * (len(out) + 1) / shards and len(out) < shards - 1:
            out.append(current)
            current = []
    out.append(current)
    return out


def talker_tensors(manifest: Path = MANIFEST) -> list[tuple[str, tuple[int, ...]]]:
    files = json.loads(manifest.read_text())["files"]
    return [(key, tuple(shape)) for key, shape, *_ in files["talker/model.safetensors"]["tensors"]]


_LAYER = re.compile(r"model\.model\.layers\.(\d+)\.")


def keep_layers(tensors: list[tuple[str, tuple[int, ...]]], layers: int | None) -> list[tuple[str, tuple[int, ...]]]:
    """The root tensors without the thinker's decoder layers from `layers` on (all of them when None)."""
    if layers is None:
        return tensors
    return [(key, shape) for key, shape in tensors
            if (m := _LAYER.match(key)) is None or int(m.group(1)) < layers]


def write_configs(out: Path, layers: int | None = None) -> None:
    """The preset's configs and voice list (the thinker's layer count set to `layers` when given), and stand-in
    tokenizers on its special ids."""
    src = preset_dir(PRESET)
    for rel in ("config.json", "preprocessor_config.json", "talker/config.json", "talker/llm/config.json",
                "talker/vae/config.json", "talker/data/voice_name.json"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, out / rel)
    if layers is not None:
        config = json.loads((out / "config.json").read_text())
        if not 0 < layers <= config["llm_config"]["num_hidden_layers"]:
            raise SystemExit(f"--layers {layers}: the thinker has {config['llm_config']['num_hidden_layers']}")
        config["llm_config"]["num_hidden_layers"] = layers
        (out / "config.json").write_text(json.dumps(config, indent=2))
    thinker, talker = standin_tokenizers(preset_config(PRESET), [])
    thinker.tokenizer.save(str(out / "tokenizer.json"))
    talker.save(str(out / "talker" / "llm" / "tokenizer.json"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shards", type=int, default=None, help="root files (default 42, the release's; with --layers "
                    "as many as keep the full checkpoint's file size)")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=None, help="keep the thinker's first K decoder layers only")
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    write_configs(out, args.layers)
    pool = Pool()
    full = root_tensors()
    tensors = keep_layers(full, args.layers)
    shards = args.shards or max(1, round(42 * sum(_numel(s) for _, s in tensors) / sum(_numel(s) for _, s in full)))
    parts = split_shards(tensors, shards)
    names = [f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors" for i in range(len(parts))]
    with torch.device("meta"):
        vae_keys = sorted(checkpoint_keys(AudioVAE(preset_config(PRESET).vae)).items())
    jobs = [(out / name, part) for name, part in zip(names, parts)]
    jobs += [(out / "talker" / "model.safetensors", talker_tensors()),
             (out / "talker" / "vae" / "model.safetensors", vae_keys)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as ex:
        sizes = list(ex.map(lambda job: write_safetensors(job[0], job[1], pool), jobs))
    seconds = time.perf_counter() - t0
    weight_map = {key: name for name, part in zip(names, parts) for key, _ in part}
    total = sum(_numel(s) for part in parts for _, s in part) * BF16
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}))
    written = sum(sizes)
    print(json.dumps({"out": str(out), "files": len(jobs), "bytes": written, "seconds": round(seconds, 1),
                      "write_GBps": round(written / seconds / 1e9, 2)}))


if __name__ == "__main__":
    main()
