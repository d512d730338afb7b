"""The configuration reference is generated from the config dataclasses, and what ships is the default.

docs/configuration.md is `python -m realtime_ming.server.config_doc`'s output (never hand-kept); every `engine.*`
key has a description; the shipped GPU configs set only what differs from the CUDA defaults; the test and
benchmark hooks are not config keys.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from realtime_ming.cli import build_parser, serve_hooks
from realtime_ming.engine.config import DEVICE_DEFAULTS, EngineConfig, PlacementConfig
from realtime_ming.engine.hooks import EngineHooks, parse_hook
from realtime_ming.server.config import ConfigError, load_config
from realtime_ming.server.config_doc import keys, main, render

ROOT = Path(__file__).resolve().parent.parent
GPU_CONFIGS = sorted((ROOT / "configs").glob("ming-flash-omni-2.0*.yaml"))


def test_committed_reference_is_the_generated_one():
    assert (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8") == render(), \
        "docs/configuration.md is stale: python -m realtime_ming.server.config_doc > docs/configuration.md"
    assert main(["--check", str(ROOT / "docs" / "configuration.md")]) == 0


def test_check_refuses_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text(render().replace("concurrent conversations", "conversations"), encoding="utf-8")
    assert main(["--check", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err


def test_every_engine_key_is_documented_and_in_the_reference():
    engine = [k for section, _, own in keys() if section.startswith("engine") for k in own]
    assert len(engine) >= 30
    assert [k.path for k in engine if not k.doc] == []
    text = render()
    assert all(f"`{k.path}`" in text for k in engine)


def test_engine_knob_count_does_not_grow():
    """Issue 48: at most 45 `engine.*` knobs; this count may only fall."""
    engine = [k for section, _, own in keys() if section.startswith("engine") for k in own]
    assert len(engine) <= 45, [k.path for k in engine]


def test_no_engine_switch_is_off_by_default_without_a_shipped_or_documented_user():
    """Issue 48: an `engine.*` key that defaults to off (false / 0) is set by a shipped config or documented
    in docs/ beyond the generated reference; else it is an experiment to delete or a test hook."""
    shipped = "\n".join(p.read_text() for p in sorted((ROOT / "configs").glob("*.yaml")))
    docs = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "configuration.md")
    off = [k for section, _, own in keys() if section.startswith("engine") for k in own
           if k.default == "false" or k.default == "0" and "0 =" in k.doc]  # a switch, not a value like the seed
    unused = [k.path for k in off
              if f"{k.path.rsplit('.', 1)[1]}:" not in shipped and f"`{k.path}`" not in docs
              and f"`{k.path.rsplit('.', 1)[1]}" not in docs]
    assert unused == []


def test_device_defaults_fill_only_fields_left_null():
    cpu, cuda = EngineConfig(), EngineConfig(placement=PlacementConfig(thinker_devices=("cuda:0", "cuda:1")))
    for cfg, row in ((cpu, DEVICE_DEFAULTS["cpu"]), (cuda, DEVICE_DEFAULTS["cuda"])):
        for key, value in row.items():
            obj = cfg
            for part in key.split("."):
                obj = getattr(obj, part)
            assert obj == value, key
    assert cuda.thinker.decode_buckets == (1, 2, 4, 8, 16) and not cuda.enforce_eager
    explicit = EngineConfig(dtype="float32", encoder_worker=True,
                            placement=PlacementConfig(thinker_devices=("cuda:0",)))
    assert (explicit.dtype, explicit.encoder_worker) == ("float32", True)  # a value set always wins


def test_a_partial_segmenter_section_keeps_the_device_default():
    """A config's segmenter keys change only themselves: on a GPU config the latency policy and its mark wait stay."""
    gpu = ROOT / "configs" / "ming-flash-omni-2.0.yaml"
    seg = load_config(gpu, ["engine.segmenter.max_tokens=30"]).engine.segmenter
    assert (seg.policy, seg.first_mark_wait_ms, seg.max_tokens) == ("latency", 60.0, 30)
    seg = load_config(gpu, ["engine.segmenter.policy=reference"]).engine.segmenter
    assert (seg.policy, seg.first_mark_wait_ms) == ("reference", 0.0)
    seg = load_config(None, ["engine.segmenter.max_tokens=30"]).engine.segmenter  # CPU: the reference policy
    assert (seg.policy, seg.first_mark_wait_ms, seg.max_tokens) == ("reference", 0.0, 30)


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.name)
def test_gpu_configs_set_only_what_differs_from_the_cuda_defaults(path, tmp_path):
    """Every engine key a shipped GPU config names changes its effective config: placement, capacities and the
    few choices of that deployment, no restated default."""
    data = yaml.safe_load(path.read_text())
    full = load_config(path).engine
    assert full.on_cuda and full.dtype == "bfloat16" and not full.enforce_eager

    def leaves(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                yield from leaves(value, prefix + [key])
            else:
                yield prefix + [key]

    for keys_ in leaves(data["engine"], []):
        reduced = yaml.safe_load(path.read_text())
        node = reduced["engine"]
        for key in keys_[:-1]:
            node = node[key]
        del node[keys_[-1]]
        tmp = tmp_path / path.name
        tmp.write_text(yaml.safe_dump(reduced))
        try:
            assert load_config(tmp).engine != full, f"{path.name}: engine.{'.'.join(keys_)} restates its default"
        except ConfigError:
            pass  # the key is needed for the config to be valid at all


@pytest.mark.parametrize("key", ["engine.thinker.forced_reply=hi", "engine.talker.steps_per_word=2",
                                 "engine.thinker.forced_transcript=hi", "engine.bench_tp_shadow=2",
                                 "engine.thinker.prefill_wait_ms=40", "engine.switch_interval_ms=0.5"])
def test_hooks_and_deleted_experiments_are_not_config_keys(key):
    with pytest.raises(ConfigError, match="unknown config key"):
        load_config(None, [key])


def test_serve_hook_flag_builds_engine_hooks():
    args = build_parser().parse_args(["serve", "--hook", "forced_reply=Sure. Fine.", "--hook", "steps_per_word=2",
                                      "--hook", "forced_turn_judgement=0.25"])
    assert serve_hooks(args) == EngineHooks(forced_reply="Sure. Fine.", steps_per_word=2, forced_turn_judgement=0.25)
    assert serve_hooks(build_parser().parse_args(["serve"])) is None
    for bad, match in (("nope=1", "NAME one of"), ("steps_per_word=two", "not a number"), ("forced_reply", "NAME=VALUE")):
        with pytest.raises(ValueError, match=match):
            parse_hook(EngineHooks(), bad)
    with pytest.raises(ValueError, match="forced_turn_judgement"):
        parse_hook(EngineHooks(), "forced_turn_judgement=2")


@pytest.mark.parametrize(("hook", "message"), [("nope=1", "NAME one of"), ("tp_shadow=2", "tp_shadow needs dummy weights")])
def test_serve_refuses_a_bad_hook_before_loading(hook, message, capsys, tmp_path):
    from realtime_ming.cli import main

    assert main(["serve", "--model-path", str(tmp_path), "--hook", hook]) == 2
    err = capsys.readouterr().err
    assert err.startswith("realtime-ming: config error:") and message in err


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    """Each file in configs/ loads as what it is: a cluster config (with the server config its replicas load) or
    a `realtime-ming serve` config."""
    from realtime_ming.cluster.config import load_cluster_config, load_replica_config

    if path.name.startswith("cluster-"):
        cluster = load_cluster_config(path)
        load_replica_config(ROOT / cluster.server_config, cluster.overrides, cluster.data_path)
    else:
        load_config(path)
