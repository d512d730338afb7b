"""Weight loading: strict sharded-safetensors loading, tensor-parallel slicing, and dummy weights.

Modules are built on the meta device, materialised on the target device in the target dtype,
then filled tensor by tensor straight from the (memory-mapped) checkpoint shards. Contract for
model modules:

* parameter and persistent-buffer names equal checkpoint keys (below the prefix);
* a root module may define `checkpoint_key_map(key) -> (target_name, shard_id) | None` for fused
  or stacked tensors (None = drop the key on purpose); the target parameter then carries
  `weight_loader(param, source: TensorSource, shard_id)` and `num_shards` (how many keys fill it);
* such a root may also define `checkpoint_sources(name, shape) -> {key: shape} | None`, the inverse
  (used by `checkpoint_keys` and to name the missing keys of a partly filled parameter);
* parameters carry `tp_dim` / `tp_splits` (see `layers.mark_tp`) for tensor-parallel narrowing;
* every module whose tensors are functions of the config (rotary tables, sinusoids, windows)
  implements `init_buffers()`, called after materialisation; checkpoint values then overwrite
  the persistent ones;
* a module may name its own parameters / buffers that keep their dtype whatever the target dtype
  in a `keep_dtypes` dict (name -> dtype: fp8 expert weights and their fp32 scales).

Every missing key, unexpected key and shape mismatch is reported in one `LoadError`.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch
from torch import nn

from .layers import TPGroup
from .shard_prefetch import ShardPrefetch

__all__ = [
    "LoadError",
    "TensorSource",
    "read_weight_map",
    "materialize",
    "load_weights",
    "init_dummy",
    "narrow_for_rank",
    "checkpoint_keys",
]

_MAX_LISTED = 25


class LoadError(RuntimeError):
    """The checkpoint does not match the model: lists every problem at once."""


def read_weight_map(path: str | Path) -> dict[str, Path]:
    """Map every tensor key to its file, from a `*.safetensors.index.json`, a folder or one file."""
    path = Path(path)
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        single = path / "model.safetensors"
        if index.is_file():
            path = index
        elif single.is_file():
            path = single
        else:
            raise LoadError(f"no model.safetensors.index.json or model.safetensors in {path}")
    if not path.is_file():
        raise LoadError(f"checkpoint file not found: {path}")
    if path.name.endswith(".index.json"):
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LoadError(f"cannot read index {path}: {exc}") from exc
        files = {k: path.parent / v for k, v in weight_map.items()}
        absent = sorted({str(f) for f in files.values() if not f.is_file()})
        if absent:
            raise LoadError(f"index {path} names missing shard files: {', '.join(absent)}")
        return files
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: path for k in f.keys()}
    except Exception as exc:  # safetensors raises its own error types for corrupt headers
        raise LoadError(f"cannot open {path}: {exc}") from exc


class TensorSource:
    """One checkpoint tensor, read lazily: `shape`, `full()`, and `narrow(dim, start, length)`."""

    def __init__(self, handle, key: str):
        self._slice = handle.get_slice(key)
        self.key = key
        self.shape = tuple(self._slice.get_shape())

    def full(self) -> torch.Tensor:
        return self._slice[:]

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + length)
        return self._slice[tuple(index)]


def narrow_for_rank(src: TensorSource | torch.Tensor, dim: int | None, splits, tp: TPGroup) -> torch.Tensor:
    """This rank's part of `src` along `dim`; with `splits`, each fused part is narrowed separately."""
    if dim is None or tp.size == 1:
        return src.full() if isinstance(src, TensorSource) else src
    sizes = splits or (src.shape[dim],)
    parts, offset = [], 0
    for part in sizes:
        start, local = tp.part_slice(part)
        parts.append(src.narrow(dim, offset + start, local))
        offset += part[0] if isinstance(part, tuple) else part
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def _targets(module: nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.state_dict(keep_vars=True))


def materialize(module: nn.Module, device: torch.device | str, dtype: torch.dtype) -> nn.Module:
    """Allocate every meta tensor on `device` (floating tensors in `dtype`) and compute buffers."""
    # to_empty/to replace Parameter objects across devices, dropping the loader attributes
    # (tp_dim, weight_loader, ...) that layers attach: carry them over by name.
    attrs = {name: dict(vars(p)) for name, p in module.named_parameters() if vars(p)}
    module.to(dtype=dtype)  # still on meta: free, so storage is allocated once, in `dtype`
    for sub in module.modules():
        for name, kept in getattr(sub, "keep_dtypes", {}).items():
            if name in sub._parameters:
                sub._parameters[name].data = sub._parameters[name].data.to(kept)
            else:
                sub._buffers[name] = sub._buffers[name].to(kept)
    module.to_empty(device=device)
    for name, p in module.named_parameters():
        for k, v in attrs.get(name, {}).items():
            setattr(p, k, v)
    for sub in module.modules():
        init = getattr(sub, "init_buffers", None)
        if callable(init):
            init()
    return module


@dataclass
class _Report:
    unexpected: list[str] = field(default_factory=list)
    shape: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @staticmethod
    def _fmt(title: str, items: list[str]) -> str:
        shown = "\n    ".join(items[:_MAX_LISTED])
        more = f"\n    ... and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else ""
        return f"  {title} ({len(items)}):\n    {shown}{more}"

    def raise_if_any(self, missing: list[str], what: str) -> None:
        sections = [
            ("missing keys", missing),
            ("unexpected keys", self.unexpected),
            ("shape mismatches", self.shape),
            ("unreadable tensors", self.errors),
        ]
        body = [self._fmt(t, items) for t, items in sections if items]
        if body:
            raise LoadError(f"checkpoint does not match {what}:\n" + "\n".join(body))


def _default_loader(tp: TPGroup):
    def load(param: torch.Tensor, src: TensorSource, shard_id) -> None:
        value = narrow_for_rank(src, getattr(param, "tp_dim", None), getattr(param, "tp_splits", None), tp)
        if tuple(value.shape) != tuple(param.shape):
            raise ValueError(f"checkpoint {tuple(src.shape)} -> rank part {tuple(value.shape)}, model {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(value)
    return load


def load_weights(
    module: nn.Module,
    weight_map: Mapping[str, Path],
    *,
    prefix: str = "",
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    tp: TPGroup = TPGroup(),
    what: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> nn.Module:
    """Materialise `module` and fill it from the keys of `weight_map` starting with `prefix`.

    Strict: every target must be filled and every key consumed, else one LoadError lists all
    problems. Reads each shard file once, in file order, the next ones read ahead into the page cache by
    parallel readers (shard_prefetch.py). `progress(done, total)` is called per tensor.
    """
    what = what or type(module).__name__
    if any(t.is_meta for t in _targets(module).values()):
        materialize(module, device, dtype)
    targets = _targets(module)
    key_map = getattr(module, "checkpoint_key_map", None)
    default = _default_loader(tp)
    filled: dict[str, set] = {}
    report = _Report()
    keys = [k for k in weight_map if k.startswith(prefix)]
    by_file: dict[Path, list[str]] = {}
    for k in keys:
        by_file.setdefault(weight_map[k], []).append(k)
    done = 0
    # several shards: read them ahead in parallel into the page cache (one file alone: nothing to overlap)
    prefetch = ShardPrefetch(list(by_file), readers=8 if len(by_file) > 1 else 0)
    with prefetch:
        for index, (path, file_keys) in enumerate(by_file.items()):
            prefetch.at(index)
            done = _load_file(path, file_keys, prefix, key_map, targets, default, filled, report, progress, done,
                              len(keys))
    missing = []
    for name, param in targets.items():
        need = getattr(param, "num_shards", 1)
        got = filled.get(name, set())
        if len(got) >= need:
            continue
        if need == 1:
            missing.append(prefix + name)
            continue
        sources = _sources(module, name, param) if key_map else None
        absent = [prefix + k for k in sources or () if key_map(k)[1] not in got]
        listed = f": {', '.join(absent[:_MAX_LISTED])}" if absent and len(absent) < need else ""
        missing.append(f"{prefix}{name} ({len(got)}/{need} parts){listed}")
    report.raise_if_any(missing, what)
    return module


def _load_file(path: Path, file_keys: list[str], prefix: str, key_map, targets: dict, default, filled: dict,
               report: _Report, progress, done: int, total: int) -> int:
    """Fill the targets of one shard file's keys (every problem into `report`); returns the tensors done so far."""
    from safetensors import safe_open

    try:
        handle_ctx = safe_open(str(path), framework="pt")
    except Exception as exc:
        report.errors.append(f"{path}: {exc}")
        return done
    with handle_ctx as handle:
        for key in file_keys:
            local = key[len(prefix):]
            target, shard_id = key_map(local) if key_map else (local, None)
            if target is None:
                continue
            param = targets.get(target)
            if param is None:
                report.unexpected.append(key)
                continue
            try:
                src = TensorSource(handle, key)
                (getattr(param, "weight_loader", None) or default)(param, src, shard_id)
            except ValueError as exc:
                report.shape.append(f"{key}: {exc}")
                filled.setdefault(target, set()).add(shard_id)  # present, wrong shape: not also "missing"
                continue
            except Exception as exc:  # corrupt data inside a readable header
                report.errors.append(f"{key} in {path.name}: {exc}")
                continue
            filled.setdefault(target, set()).add(shard_id)
            done += 1
            if progress:
                progress(done, total)
    return done


def _sources(module: nn.Module, name: str, tensor: torch.Tensor) -> dict[str, tuple[int, ...]] | None:
    """Checkpoint keys filling fused/stacked target `name` (root's `checkpoint_sources`); None = the name itself."""
    expand = getattr(module, "checkpoint_sources", None)
    return expand(name, tuple(tensor.shape)) if expand else None


def checkpoint_keys(module: nn.Module) -> dict[str, tuple[int, ...]]:
    """Every checkpoint key `module` (a load root) consumes, with its shape.

    Parameters and persistent buffers stand for themselves unless the root's
    `checkpoint_sources(name, shape) -> {key: shape} | None` names the keys of a fused/stacked
    one; each such key must map back to that parameter through `checkpoint_key_map` and the
    distinct shard ids must number its `num_shards` (else ValueError: the module's maps disagree).
    Shapes are the module's as built, i.e. the checkpoint's for tensor-parallel size 1. Works on meta.
    """
    key_map = getattr(module, "checkpoint_key_map", None)
    keys: dict[str, tuple[int, ...]] = {}
    for name, tensor in _targets(module).items():
        found = _sources(module, name, tensor)
        if found is None:
            found = {name: tuple(tensor.shape)}
        shards = set()
        for key in found:
            target, shard = key_map(key) if key_map else (key, None)
            if target != name:
                raise ValueError(f"checkpoint key {key} maps to {target}, not to {name}")
            shards.add(shard)
        if len(shards) != getattr(tensor, "num_shards", 1):
            raise ValueError(f"{name}: {len(shards)} checkpoint shards, num_shards {getattr(tensor, 'num_shards', 1)}")
        keys.update(found)
    return keys


def _seed_for(name: str, seed: int) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def init_dummy(module: nn.Module, *, seed: int = 0, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> nn.Module:
    """Fill `module` with seeded random weights directly on `device` (benchmarks, tiny default).

    Linear/conv weights N(0, 1/fan_in); 1-D "norm" weights 1 + N(0, 0.1²); biases and expert biases
    N(0, 0.05²); embedding-like tables N(0, 1). Each tensor's generator is seeded from its name, so
    the result does not depend on construction order or on the device's other work.
    """
    materialize(module, device, dtype)
    from .layers import VocabParallelEmbedding

    tables = {id(m.weight) for m in module.modules() if isinstance(m, (nn.Embedding, VocabParallelEmbedding))}
    gen = torch.Generator(device=device)
    with torch.no_grad():
        for name, p in module.named_parameters():
            gen.manual_seed(_seed_for(name, seed))
            custom = getattr(p, "dummy_init", None)
            if custom is not None:
                custom(p, gen)
            elif id(p) in tables:
                p.normal_(0.0, 1.0, generator=gen)
            elif p.dim() >= 2:
                # stacked expert weights [E, out, in]: fan_in is the last dim, not E's slice
                fan_in = p.shape[-1] if getattr(p, "stacked", False) else p[0].numel()
                p.normal_(0.0, fan_in ** -0.5, generator=gen)
            elif "norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.1, generator=gen)
            else:
                p.normal_(0.0, 0.05, generator=gen)
    return module


def iter_prefixed(weight_map: Mapping[str, Path], prefixes: Iterable[str]) -> dict[str, Path]:
    """The subset of `weight_map` under any of `prefixes` (helper for split loads)."""
    prefixes = tuple(prefixes)
    return {k: v for k, v in weight_map.items() if k.startswith(prefixes)}
