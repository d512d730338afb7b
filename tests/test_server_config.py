"""Config loading: the shipped configs/*.yaml, unknown keys by dotted path, typed overrides, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from realtime_ming.cli import build_parser, main, serve_config
from realtime_ming.server.config import (
    ConfigError,
    ServerConfig,
    config_to_dict,
    load_config,
)

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))


def test_configs_folder_is_not_empty():
    """configs/ ships example files."""
    assert {p.name for p in CONFIGS} >= {"tiny-cpu.yaml", "ming-flash-omni-2.0.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_loads(path):
    """Every configs/*.yaml loads without unknown keys: a server config into a ServerConfig; a cluster config
    (`cluster-*.yaml`, `realtime-ming serve-cluster`) into a ClusterConfig whose replicas' server config loads too."""
    if not path.name.startswith("cluster-"):
        assert isinstance(load_config(path), ServerConfig)
        return
    from realtime_ming.cluster.config import load_cluster_config

    cluster = load_cluster_config(path)
    server = None if cluster.server_config is None else Path(__file__).parent.parent / cluster.server_config
    assert isinstance(load_config(server, cluster.overrides), ServerConfig)


def test_defaults_without_a_file():
    """No file and no overrides gives exactly the dataclass defaults."""
    assert load_config() == ServerConfig()


def test_unknown_keys_are_named_by_dotted_path(tmp_path):
    """Unknown keys are rejected with their full dotted path."""
    path = tmp_path / "bad.yaml"
    path.write_text("server:\n  limits:\n    max_sesions: 3\n  colour: red\n")
    with pytest.raises(ConfigError, match=r"^unknown config key\(s\): server.colour$"):
        load_config(path)
    path.write_text("server:\n  limits:\n    max_sesions: 3\n")
    with pytest.raises(ConfigError, match=r"^unknown config key\(s\): server.limits.max_sesions$"):
        load_config(path)


def test_overrides_convert_to_field_types(tmp_path):
    """--set values become ints, floats, bools, tuples and None per field type; they beat the file."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"server": {"port": 9000}}))
    cfg = load_config(path, [
        "server.port=0",
        "server.limits.idle_timeout_s=2",
        "session.vad.enabled=false",
        "session.vad.detector.threshold=0.7",
        "server.auth.api_keys=[a, b]",
        "engine.placement.thinker_devices=cuda:0,cuda:1",
        "session.voice=null",
    ])
    assert cfg.server.port == 0
    assert cfg.server.limits.idle_timeout_s == 2.0 and isinstance(cfg.server.limits.idle_timeout_s, float)
    assert cfg.session.vad.enabled is False and cfg.session.vad.detector.threshold == 0.7
    assert cfg.server.auth.api_keys == ("a", "b")
    assert cfg.engine.placement.thinker_devices == ("cuda:0", "cuda:1")
    assert cfg.session.voice is None


@pytest.mark.parametrize(("override", "message"), [
    ("server.port=1.5", "server.port: expected an integer, got 1.5"),
    ("session.vad.enabled=yes please", "session.vad.enabled: expected true/false, got 'yes please'"),
    ("server.port", "override 'server.port': expected dotted.key=value"),
    ("server.port.x=1", "server.port: expected an integer, got {'x': 1}"),
    ("session.vad.backend=ten", "session.vad: session.vad.backend must be one of ('silero', 'webrtc'), got 'ten'"),
    ("engine.thinker.all_reduce=fast",
     "engine.thinker: engine.thinker.all_reduce must be one of ('nccl', 'one_shot'), got 'fast'"),
])
def test_bad_overrides_name_the_key(override, message):
    """Type and validation errors name the dotted key."""
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert str(info.value) == message


def test_config_to_dict_round_trips():
    """The plain-data dump of a config loads back to the same config."""
    cfg = load_config(None, ["server.auth.api_keys=[k]", "session.max_items=10"])
    assert load_config(None, [f"{k}={json.dumps(v)}" for k, v in config_to_dict(cfg).items()]) == cfg


def test_cli_shorthands_and_set(tmp_path):
    """serve --model-path/--host/--port map to config keys (values verbatim); --set wins over them."""
    args = build_parser().parse_args([
        "serve", "--model-path", "/models/a: b", "--port", "0", "--host", "0.0.0.0",
        "--set", "server.host=127.0.0.1", "--set", "session.max_items=9"])
    cfg = serve_config(args)
    assert cfg.engine.model_path == "/models/a: b"
    assert (cfg.server.host, cfg.server.port, cfg.session.max_items) == ("127.0.0.1", 0, 9)


def test_cli_config_error_exits_2(tmp_path, capsys):
    """A bad config makes `serve` exit with status 2 and a one-line message."""
    path = tmp_path / "bad.yaml"
    path.write_text("nope: 1\n")
    assert main(["serve", "--config", str(path)]) == 2
    assert capsys.readouterr().err.strip() == "realtime-ming: config error: unknown config key(s): nope"
