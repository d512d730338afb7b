"""`realtime-ming serve` refuses a configuration it cannot serve with one stderr line and exit 2.

Each case runs the real CLI in a subprocess (`python -m realtime_ming.cli serve ...`) and checks
that stderr is exactly one line starting `realtime-ming:`, naming the problem, with no traceback,
and that the refusal comes before the model loads (no engine log line precedes it). The cases run
in parallel (one process per CPU). What a subprocess cannot show on this machine (too few GPUs, the
opt-in warning, keys from the environment) is checked in-process on the same functions.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml
from served_cli_support import served_cli
from server_support import StubEngine, http_request
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from realtime_ming.model.loader import LoadError, read_weight_map
from realtime_ming.server import RealtimeServer, load_config
from realtime_ming.server.config import TINY_MAX_OUTPUT_TOKENS, config_to_dict, load_serve_config
from realtime_ming.server import run
from realtime_ming.server.config_report import summary
from realtime_ming.server.startup import StartupError, check_config, is_loopback, load_failure

REPO = Path(__file__).resolve().parent.parent
CPU_ONLY_TORCH = torch.version.cuda is None

# name -> (serve arguments; "{tmp}", "{ckpt_no_vae}", "{ckpt_no_tokenizer}", "{busy_port}" are filled in), expected text
CASES: dict[str, tuple[list[str], str]] = {
    "model_path_missing": (["--model-path", "{tmp}/nowhere"], "{tmp}/nowhere does not exist"),
    "model_path_empty": (["--model-path", "{tmp}/empty"], "{tmp}/empty is an empty folder"),
    "model_path_file": (["--model-path", "{tmp}/a-file"], "{tmp}/a-file is a file, not a checkpoint folder"),
    "checkpoint_missing_weights": (["--model-path", "{ckpt_no_vae}"],
                                   "checkpoint file not found: {ckpt_no_vae}/talker/vae/model.safetensors"),
    "checkpoint_missing_config": (["--model-path", "{tmp}/only-weights"],
                                  "missing checkpoint file: {tmp}/only-weights/config.json"),
    "checkpoint_missing_tokenizer": (["--model-path", "{ckpt_no_tokenizer}"], "thinker tokenizer not found"),
    "config_file_missing": (["--config", "{tmp}/nope.yaml"], "config file not found: {tmp}/nope.yaml"),
    "config_yaml_syntax": (["--config", "{tmp}/broken.yaml"], "{tmp}/broken.yaml: YAML syntax error at line 3"),
    "config_json_syntax": (["--config", "{tmp}/broken.json"], "{tmp}/broken.json: JSON syntax error at line 1"),
    "set_yaml_syntax": (["--set", "server.port=[1"], "--set server.port=[1: the value is not valid YAML"),
    "unknown_key": (["--set", "server.colour=red"], "unknown config key(s): server.colour"),
    "bad_value": (["--set", "server.limits.max_sessions=0"], "server.limits.max_sessions must be > 0"),
    "port_in_use": (["--port", "{busy_port}"], "port {busy_port} is already in use"),
    "not_a_device": (["--set", "engine.placement.talker_device=gpu0"], "'gpu0' is not a device"),
    "cuda_config_on_cpu_torch": (["--set", "engine.placement.thinker_devices=[cuda:0]"], "is a CPU-only build"),
    "gpu_config_on_cpu_machine": (["--config", "configs/ming-flash-omni-2.0.yaml"], "is a CPU-only build"),
    "unknown_voice": (["--set", "session.voice=nobody"], "session.voice: unknown voice 'nobody'; this model's voices"),
    "public_without_keys": (["--host", "0.0.0.0"], "refusing to listen on 0.0.0.0"),
    "public_config_without_env": (["--config", "configs/public.yaml"],
                                  "the environment variable REALTIME_MING_API_KEYS is unset or empty"),
    "keys_file_missing": (["--set", "server.auth.api_keys_file={tmp}/keys.txt"], "cannot read {tmp}/keys.txt"),
    "tls_cert_missing": (["--ssl-certfile", "{tmp}/cert.pem", "--ssl-keyfile", "{tmp}/key.pem"],
                         "server.tls.certfile: {tmp}/cert.pem does not exist"),
    "tls_half_configured": (["--ssl-certfile", "{tmp}/cert.pem"], "server.tls needs both certfile and keyfile"),
    "tls_not_pem": (["--ssl-certfile", "{tmp}/a-file", "--ssl-keyfile", "{tmp}/a-file"],
                    "server.tls: cannot use certificate {tmp}/a-file"),
}
CUDA_CASES = {"cuda_config_on_cpu_torch", "gpu_config_on_cpu_machine"}


def _checkpoint_copy(src: Path, dst: Path, drop: str | None) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("cases"))
    if drop:
        (dst / drop).unlink()
    return dst


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, fixture_root):
    """Run every case's CLI at once; returns name -> (returncode, stdout, stderr, fill-ins)."""
    tmp = tmp_path_factory.mktemp("startup")
    (tmp / "empty").mkdir()
    (tmp / "a-file").write_text("not a checkpoint\n")
    (tmp / "broken.yaml").write_text("server:\n  port: [8000\nsession: {}\n")
    (tmp / "broken.json").write_text('{"server": }')
    (tmp / "only-weights").mkdir()
    for src in {*read_weight_map(fixture_root).values(), fixture_root / "model.safetensors.index.json"}:
        if src.is_file():  # every root shard the index names (a one-file set may have no index)
            shutil.copy(src, tmp / "only-weights" / src.name)
    no_tokenizer = _checkpoint_copy(fixture_root, tmp / "ckpt-no-tokenizer", None)
    assert not (no_tokenizer / "tokenizer.json").exists()
    no_vae = _checkpoint_copy(fixture_root, tmp / "ckpt-no-vae", "talker/vae/model.safetensors")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    fill = {"tmp": str(tmp), "ckpt_no_vae": str(no_vae), "ckpt_no_tokenizer": str(no_tokenizer),
            "busy_port": str(busy.getsockname()[1])}
    env = {k: v for k, v in os.environ.items() if k != "REALTIME_MING_API_KEYS"}
    env["PYTHONPATH"] = str(REPO)

    def run(name: str):
        args = [a.format(**fill) for a in CASES[name][0]]
        done = subprocess.run([sys.executable, "-m", "realtime_ming.cli", "serve", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=180)
        return name, (done.returncode, done.stdout, done.stderr, fill)

    try:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            return dict(pool.map(run, CASES))
    finally:
        busy.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_startup_error_is_one_line_exit_2(outcomes, name):
    """Stderr is one `realtime-ming:` line naming the problem; no traceback, nothing logged before it; exit 2."""
    if name in CUDA_CASES and not CPU_ONLY_TORCH:
        pytest.skip("this torch has CUDA: the CPU-only refusal does not apply")
    returncode, stdout, stderr, fill = outcomes[name]
    lines = stderr.splitlines()
    assert returncode == 2, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith("realtime-ming: ")
    assert CASES[name][1].format(**fill) in lines[0]
    assert "Traceback" not in stderr and stdout == ""


def test_version_and_help_have_no_internals():
    """`--version` prints the installed version; `--help` says what the tool is, no internal names."""
    from importlib.metadata import version

    run = [sys.executable, "-m", "realtime_ming.cli"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    shown = subprocess.run([*run, "--version"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert (shown.returncode, shown.stdout.strip()) == (0, f"realtime-ming {version('realtime-ming')}")
    helped = subprocess.run([*run, "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "OpenAI-Realtime-compatible" in helped.stdout
    assert "_COMMANDS" not in helped.stdout and "serve" in helped.stdout


# ---- in-process: the same checks where a subprocess cannot reach them on this machine -----------
@pytest.mark.parametrize(("config", "visible", "expected"), [
    ("ming-flash-omni-2.0-tp4.yaml", 2, "uses cuda:0, cuda:1, cuda:2, cuda:3, cuda:4 (5 GPUs), but 2 GPU(s) are visible"),
    ("ming-flash-omni-2.0.yaml", 0, "no CUDA GPU is visible to torch"),
])
def test_too_few_gpus_for_the_placement(monkeypatch, config, visible, expected):
    """On a CUDA build of torch, a placement beyond the visible GPUs is refused before loading."""
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    with pytest.raises(StartupError) as info:
        check_config(load_config(REPO / "configs" / config))
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_enough_gpus_pass_the_device_check(monkeypatch):
    """The 2-GPU config passes on two visible GPUs (with the tiny model: nothing else to check)."""
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_config(load_config(REPO / "configs" / "ming-flash-omni-2.0.yaml"))


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("192.0.2.7", False),
])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_keys_from_env_or_file_satisfy_a_public_host(monkeypatch, tmp_path):
    """configs/public.yaml starts once its env variable holds keys; a keys file works the same way."""
    monkeypatch.setenv("REALTIME_MING_API_KEYS", "k1, k2,")
    from realtime_ming.server.config import resolve_api_keys

    cfg = resolve_api_keys(load_config(REPO / "configs" / "public.yaml"))
    assert cfg.server.auth.api_keys == ("k1", "k2")
    check_config(cfg)
    keys = tmp_path / "keys"
    keys.write_text("# operators\nk3\n\nk4\n")
    cfg = resolve_api_keys(load_config(None, ["server.host=0.0.0.0", f"server.auth.api_keys_file={keys}"]))
    assert cfg.server.auth.api_keys == ("k3", "k4")
    check_config(cfg)


def test_tiny_default_replies_are_short_unless_configured():
    """`serve` caps the tiny model's replies; an explicit value, or a real model, keeps its own."""
    assert load_serve_config().session.max_output_tokens == TINY_MAX_OUTPUT_TOKENS
    assert load_serve_config(None, ["session.max_output_tokens=300"]).session.max_output_tokens == 300
    real = load_serve_config(None, ["engine.model_path=/models/x"]).session.max_output_tokens
    assert real == load_config().session.max_output_tokens != TINY_MAX_OUTPUT_TOKENS


def test_load_failures_map_to_one_line():
    """Failures only a load can meet become one line; an unexpected exception type stays a bug."""
    message = load_failure(LoadError("checkpoint does not match thinker:\n  missing: a\n  missing: b"))
    assert message == "cannot load the model: checkpoint does not match thinker: missing: a missing: b"
    assert "out of GPU memory" in load_failure(torch.OutOfMemoryError("CUDA out of memory"))
    assert load_failure(ZeroDivisionError()) is None


def _port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_run_server_serves_the_loaded_engine_on_the_bound_port_then_closes_it(monkeypatch):
    """`run_server` binds before it loads, hands `serve` the listening socket and the engine, returns `serve`'s exit
    code and closes the engine after it."""
    engine, seen, closes = StubEngine(), {}, []
    close = engine.close
    monkeypatch.setattr(engine, "close", lambda: (closes.append(True), close()))
    monkeypatch.setattr(run, "load_engine", lambda cfg, hooks: engine)

    def serve(cfg, served, sock):
        seen.update(engine=served, port=sock.getsockname()[1], closed=bool(closes))
        sock.close()
        return 3

    assert run.run_server(load_config(None, ["server.port=0"]), serve=serve) == 3
    assert seen["engine"] is engine and seen["port"] > 0 and not seen["closed"]
    assert closes == [True]


def test_run_server_turns_a_load_failure_into_one_line_and_frees_the_port(monkeypatch):
    """A load failure of a known kind is a `StartupError` of one line, raised after the port is closed again; an
    unknown exception stays itself (a bug, with its traceback)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cfg = load_config(None, [f"server.port={port}"])

    def failing(error):
        def load(cfg, hooks):
            assert not _port_is_free(port)  # bound before the load
            raise error
        return load

    monkeypatch.setattr(run, "load_engine", failing(LoadError("checkpoint does not match thinker")))
    with pytest.raises(StartupError, match="^cannot load the model: checkpoint does not match thinker$"):
        run.run_server(cfg, serve=lambda *_: 0)
    assert _port_is_free(port)
    monkeypatch.setattr(run, "load_engine", failing(ZeroDivisionError()))
    with pytest.raises(ZeroDivisionError):
        run.run_server(cfg, serve=lambda *_: 0)
    assert _port_is_free(port)


async def test_public_host_needs_keys_or_opt_in(caplog):
    """RealtimeServer itself refuses 0.0.0.0 without keys; the opt-in serves and logs a warning."""
    engine = StubEngine()
    try:
        with pytest.raises(StartupError, match="without API keys"):
            await RealtimeServer(load_config(None, ["server.host=0.0.0.0", "server.port=0"]), engine).start()
        cfg = load_config(None, ["server.host=0.0.0.0", "server.port=0", "server.auth.allow_unauthenticated=true"])
        with caplog.at_level(logging.WARNING, logger="realtime_ming.server.startup"):
            async with RealtimeServer(cfg, engine) as srv:
                status, _, _ = await http_request(srv.port, "/health")
                assert status == 200
        assert any("without authentication" in r.getMessage() for r in caplog.records)
    finally:
        engine.close()


async def test_keys_from_env_are_enforced(monkeypatch):
    """Keys named by api_keys_env guard the WebSocket: none -> 401, the key -> upgraded."""
    monkeypatch.setenv("RM_TEST_KEYS", "sekret")
    engine = StubEngine()
    try:
        cfg = load_config(None, ["server.host=0.0.0.0", "server.port=0", "server.auth.api_keys_env=RM_TEST_KEYS"])
        async with RealtimeServer(cfg, engine) as srv:
            url = f"ws://127.0.0.1:{srv.port}/v1/realtime"
            with pytest.raises(InvalidStatus) as info:
                await connect(url)
            assert info.value.response.status_code == 401
            async with connect(url, additional_headers={"Authorization": "Bearer sekret"}) as ws:
                assert ws.protocol.state.name == "OPEN"
    finally:
        engine.close()


async def test_access_log_is_debug(caplog):
    """A /health poll logs nothing at INFO (websockets' per-request lines are DEBUG)."""
    engine = StubEngine()
    try:
        async with RealtimeServer(load_config(None, ["server.port=0"]), engine) as srv:
            caplog.clear()
            with caplog.at_level(logging.DEBUG):
                await http_request(srv.port, "/health")
                await http_request(srv.port, "/health")
        polls = [r for r in caplog.records if r.name == "websockets.server" and "HTTP response" in r.getMessage()]
        assert len(polls) == 2 and all(r.levelno == logging.DEBUG for r in polls)
    finally:
        engine.close()


# ---- what `serve` says when it starts: a summary at INFO, the full config on request -------------
def test_serve_logs_a_short_summary_not_the_whole_config():
    """At INFO the start-up output up to the serving line is a handful of lines: the summary names the
    model, the devices, the bound port, the auth and how to see the full config, which is not logged."""
    with served_cli("--log-level", "INFO") as server:
        startup = server.startup
        assert server.stop() == 0
    assert "effective config:\n" not in startup and "limits:" not in startup and "max_frame_bytes" not in startup
    assert len(startup.splitlines()) <= 15, startup
    summary_lines = {line.split(":", 1)[0].strip(): line for line in startup.splitlines() if line.startswith("  ")}
    assert "embedded tiny Ming" in summary_lines["model"]
    assert "thinker cpu" in summary_lines["devices"] and "encoders cpu" in summary_lines["devices"]
    assert f"ws://127.0.0.1:{server.port}/v1/realtime" in summary_lines["listen"]
    assert "none (loopback only)" in summary_lines["auth"]
    assert "--print-config" in summary_lines["config"] and "DEBUG" in summary_lines["config"]


def test_print_config_prints_the_effective_config_with_keys_redacted():
    """`serve --print-config` checks the config, prints it as YAML (what the server would run, keys redacted) and
    exits 0 without loading a model; a config it would refuse is refused the same way."""
    args = ["--port", "9123", "--set", "server.auth.api_keys=[k-secret-1, k-secret-2]", "--set", "session.voice=tiny"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = [sys.executable, "-m", "realtime_ming.cli", "serve", "--print-config"]
    done = subprocess.run([*run, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "k-secret" not in done.stdout + done.stderr
    expected = config_to_dict(load_serve_config(None, ["server.port=9123", "server.auth.api_keys=[a, b]",
                                                       "session.voice=tiny"]))
    expected["server"]["auth"]["api_keys"] = ["<2 key(s)>"]
    assert yaml.safe_load(done.stdout) == expected
    refused = subprocess.run([*run, "--set", "server.colour=red"], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and refused.stdout == ""  # the fast tier's one subprocess refusal
    assert refused.stderr.startswith("realtime-ming: ") and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "unknown config key(s): server.colour" in refused.stderr


def test_summary_of_a_gpu_config_names_the_placement_and_the_keys(monkeypatch):
    """The summary reads the placement and auth from the config: TP, talker replicas, encoders, key count."""
    monkeypatch.setenv("REALTIME_MING_API_KEYS", "k1,k2,k3")
    from realtime_ming.server.config import resolve_api_keys

    cfg = resolve_api_keys(load_config(REPO / "configs" / "ming-flash-omni-2.0-h200x4.yaml",
                                       ["server.host=0.0.0.0", "server.auth.api_keys_env=REALTIME_MING_API_KEYS",
                                        "engine.model_path=/models/Ming-flash-omni-2.0"]))
    place = cfg.engine.placement
    text = summary(cfg, 8123)
    lines = dict(line.strip().split(":", 1) for line in text.splitlines())
    assert set(lines) == {"model", "devices", "listen", "auth", "config"}
    assert "checkpoint /models/Ming-flash-omni-2.0" in lines["model"]
    assert f"thinker {', '.join(place.thinker_devices)} (TP={len(place.thinker_devices)})" in lines["devices"]
    assert f"talker + VAE replicas on {', '.join(place.talker_devices)}" in lines["devices"]
    assert f"encoders {place.encoder_device}" in lines["devices"]
    assert "ws://0.0.0.0:8123/v1/realtime" in lines["listen"]
    assert f"{cfg.server.frontend_processes} front-end processes" in lines["listen"]
    assert "3 API key(s) from $REALTIME_MING_API_KEYS" in lines["auth"]
    assert "k1" not in text
