"""The examples in examples/ run as scripts against the tiny model and leave the files they promise.

Most runs point `--url` at one loopback server of this module (one engine load); `talk_wav.py`
without `--url` and `local_agent.py` start their own engine, as a user's first run would.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import wave
from pathlib import Path

import pytest
import soundfile as sf
from server_support import espeak, seconds

from realtime_ming.server import RealtimeServer, load_config

pytestmark = [pytest.mark.realtime, pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def engine():
    """The tiny engine answering with a fixed reply (the examples' own demo setting)."""
    from realtime_ming.engine import Engine
    from realtime_ming.engine.config import EngineConfig
    from realtime_ming.engine.hooks import EngineHooks
    eng = Engine.create(EngineConfig(), hooks=EngineHooks(forced_reply="Hello there, this is a test."))
    yield eng
    eng.close()


@pytest.fixture
async def url(engine):
    async with RealtimeServer(load_config(None, ["server.port=0"]), engine) as srv:
        yield f"ws://127.0.0.1:{srv.port}/v1/realtime"


async def run_example(name: str, *args: str, cwd: Path) -> str:
    """Run examples/`name` with `args`; returns its stdout, failing the test on a non-zero exit."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLES / name), *args, cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(seconds(240)):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode == 0, f"{name} exited {process.returncode}:\n{out.decode()}\n{err.decode()}"
    return out.decode()


def wav_header(path: Path) -> tuple[int, int, int, int]:
    """(rate, channels, sample width, frames) of a WAV file."""
    with wave.open(str(path)) as wav:
        return wav.getframerate(), wav.getnchannels(), wav.getsampwidth(), wav.getnframes()


@pytest.mark.parametrize(("rate_hz", "beta"), [(44100, False), (24000, True)])
async def test_example_talk_wav_saves_the_reply(url, tmp_path, rate_hz, beta):
    """talk_wav.py streams a test tone and saves a mono 16-bit reply at the requested rate."""
    flags = ["--beta"] if beta else []
    out = await run_example("talk_wav.py", "--url", url, "--rate", str(rate_hz), "--output", "reply.wav", *flags,
                            cwd=tmp_path)
    rate, channels, width, frames = wav_header(tmp_path / "reply.wav")
    assert (rate, channels, width) == (rate_hz, 1, 2) and frames > 0
    assert f"at {rate_hz} Hz -> reply.wav" in out


async def test_example_talk_wav_serves_the_tiny_model_itself(tmp_path):
    """talk_wav.py without --url starts the tiny model behind its own server and still saves a reply."""
    out = await run_example("talk_wav.py", "--output", "own.wav", "--max-output-tokens", "12", cwd=tmp_path)
    assert wav_header(tmp_path / "own.wav")[0] == 24000
    assert "transcript: 'Hello! This" in out


@pytest.mark.parametrize("as_text", [True, False])
async def test_example_image_turn_answers(url, tmp_path, as_text):
    """image_turn.py sends a generated picture with a question and prints (and, when spoken, saves) the answer."""
    flags = ["--text"] if as_text else ["--output", "answer.wav"]
    out = await run_example("image_turn.py", "--url", url, *flags, cwd=tmp_path)
    assert "answer incomplete: 'Hello there" in out
    assert (tmp_path / "answer.wav").exists() is not as_text


async def test_example_barge_in_cancels_and_truncates(url, tmp_path):
    """barge_in.py interrupts the reply after 300 ms of playback: cancelled by the client, item truncated at 300 ms."""
    out = await run_example("barge_in.py", "--url", url, "--interrupt-ms", "300", cwd=tmp_path)
    assert "response cancelled (client_cancelled)" in out
    assert "truncated at 300 ms" in out


async def test_example_barge_in_with_speech_uses_server_vad(url, tmp_path):
    """barge_in.py --speech: the server's VAD hears the recording, cancels (turn_detected) and answers it.

    The reply must still be generating when the VAD fires (~0.5 s into the recording): 16 tokens were
    generated faster than that on a warm engine, so the reply is long enough to outlast it.
    """
    sf.write(tmp_path / "stop.wav", espeak("Wait, stop please.", tmp_path), 24000)
    out = await run_example("barge_in.py", "--url", url, "--speech", "stop.wav", "--max-output-tokens", "96",
                            cwd=tmp_path)
    assert "response cancelled (turn_detected)" in out, out
    assert "answer to the interruption: incomplete" in out


async def test_example_local_agent_runs_in_process(tmp_path):
    """local_agent.py loads the tiny engine itself, answers a text and an audio turn, and saves a 24 kHz WAV."""
    out = await run_example("local_agent.py", "--output", "local.wav", "--max-output-tokens", "12", cwd=tmp_path)
    rate, channels, width, frames = wav_header(tmp_path / "local.wav")
    assert (rate, channels, width) == (24000, 1, 2) and frames > 0
    assert "text turn (incomplete): 'Hello! This" in out
