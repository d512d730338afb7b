"""`server.frontend_processes=2` end to end: `python -m realtime_ming.cli serve` (the embedded tiny model, CPU) with two
front-end processes, driven over loopback by clients that validate every frame: sessions and the session limit
across both, a drain, a killed front end restarted, a TLS burst spread by the hand-off, a cloned voice shared. The
engine host and its remote engines in one process: tests/test_frontends.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import numpy as np
import pytest
from served_cli_support import served_cli
from server_support import WsClient, http_request
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from realtime_ming.protocol import Dialect
from realtime_ming.server.app import FRONTEND_HEADER

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # the full tier: served processes


async def _session(port: int) -> tuple[WsClient, str]:
    ws = await connect(f"ws://127.0.0.1:{port}/v1/realtime")
    client = WsClient(ws, Dialect.GA)
    assert (await client.recv())["type"] == "session.created"
    return client, ws.response.headers[FRONTEND_HEADER]


async def _text_turn(client: WsClient) -> dict:
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]})
    await client.send(type="response.create", response={"max_output_tokens": 6})
    return (await client.recv_until("response.done", timeout=60))[-1]["response"]


async def _spoken_turn(client: WsClient) -> dict:
    await client.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    await client.recv_until("session.updated")
    await client.append_audio(np.sin(np.linspace(0, 300 * np.pi, 24000)).astype(np.float32) * 0.3)
    await client.send(type="input_audio_buffer.commit")
    await client.send(type="response.create", response={"max_output_tokens": 6})
    return (await client.recv_until("response.done", timeout=60))[-1]["response"]


async def _frontend_pids(port: int) -> dict[int, int]:
    pids = {}
    for _ in range(40):
        status, _, body = await http_request(port, "/health")
        if status == 200:
            info = json.loads(body)["frontend"]
            pids[info["index"]] = info["pid"]
        if len(pids) == 2:
            break
    return pids


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (Linux /proc)."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids


def _assert_front_ends_never_loaded_torch(server_pid: int) -> None:
    """The front-end processes (children of the server) serve sessions, turns and voice uploads without torch
    (~250 MiB each): only the engine's process maps libtorch."""
    kids = _children(server_pid)
    assert len(kids) >= 2, kids
    for kid in kids:
        assert "libtorch" not in open(f"/proc/{kid}/maps").read(), f"front-end process {kid} loaded torch"
    assert "libtorch" in open(f"/proc/{server_pid}/maps").read()  # the check can tell


def test_two_front_ends_share_the_port_the_limit_and_a_drain():
    """Sessions on both front ends answer spoken and text turns; max_sessions is the server's; SIGTERM exits 0."""

    async def scenario(port: int) -> None:
        clients: dict[str, WsClient] = {}
        extra: list[WsClient] = []
        for _ in range(4):  # the kernel picks the process: open until each front end holds one (limit 4)
            client, index = await _session(port)
            if index in clients:
                extra.append(client)
            else:
                clients[index] = client
            if len(clients) == 2:
                break
        assert set(clients) == {"0", "1"}, "every session landed on one front end"
        for client in clients.values():
            assert (await _text_turn(client))["status"] in ("completed", "incomplete")
            assert (await _spoken_turn(client))["status"] in ("completed", "incomplete")
        while len(clients) + len(extra) < 4:
            extra.append((await _session(port))[0])
        with pytest.raises(ConnectionClosed) as refused:  # 4 open across two processes: the fifth waits
            over = await connect(f"ws://127.0.0.1:{port}/v1/realtime")
            await over.recv()
        assert refused.value.rcvd.code == CloseCode.TRY_AGAIN_LATER
        status, _, body = await http_request(port, "/health/ready")
        assert status == 503 and json.loads(body)["reason"] == "at max_sessions"
        for client in [*clients.values(), *extra]:
            await client.ws.close()

    with served_cli("--set", "server.frontend_processes=2", "--set", "server.limits.max_sessions=4") as server:
        asyncio.run(scenario(server.port))
        _assert_front_ends_never_loaded_torch(server.proc.pid)
        assert server.stop(signal.SIGTERM, timeout=30) == 0


def test_a_killed_front_end_is_restarted_and_its_tickets_come_back():
    async def scenario(port: int) -> None:
        pids = await _frontend_pids(port)
        assert set(pids) == {0, 1}
        held = [await _session(port) for _ in range(2)]  # max_sessions=2: full
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        fresh: dict[int, int] = {}
        while time.monotonic() < deadline:
            fresh = await _frontend_pids(port)
            if fresh.get(0) not in (None, pids[0]) and fresh.get(1) == pids[1]:
                break
            await asyncio.sleep(0.5)
        assert fresh.get(0) not in (None, pids[0]) and fresh[1] == pids[1], fresh
        for client, index in held:
            if index == "1":
                await client.ws.close()
        # the dead process's sessions gave their tickets back: both slots open again
        fresh_sessions = [await _session(port) for _ in range(2)]
        client, _ = fresh_sessions[0]
        assert (await _text_turn(client))["status"] in ("completed", "incomplete")
        for client, _ in fresh_sessions:
            await client.ws.close()

    with served_cli("--set", "server.frontend_processes=2", "--set", "server.limits.max_sessions=2") as server:
        asyncio.run(scenario(server.port))
        assert server.stop(signal.SIGTERM, timeout=30) == 0
        assert "exited with code -9" in server.output and "restarting it" in server.output


def test_a_burst_over_tls_spreads_over_both_front_ends(tmp_path):
    """8 wss:// sessions opened at once land 4 + 4 (the least-loaded hand-off); TLS ends in the front ends."""
    trustme = pytest.importorskip("trustme")
    import ssl

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)

    async def scenario(port: int) -> None:
        async def one():
            ws = await connect(f"wss://127.0.0.1:{port}/v1/realtime", ssl=client_tls, open_timeout=60)
            assert json.loads(await ws.recv())["type"] == "session.created"
            return ws

        sockets = await asyncio.gather(*(one() for _ in range(8)))
        split = [ws.response.headers[FRONTEND_HEADER] for ws in sockets]
        # exact (4 + 4) unless a close report was still in flight: never worse than 5 + 3
        assert {split.count("0"), split.count("1")} <= {3, 4, 5} and set(split) == {"0", "1"}, split
        assert (await _text_turn(WsClient(sockets[0], Dialect.GA)))["status"] in ("completed", "incomplete")
        await asyncio.gather(*(ws.close() for ws in sockets))

    with served_cli("--set", "server.frontend_processes=2", "--set", f"server.tls.certfile={certfile}",
                    "--set", f"server.tls.keyfile={keyfile}") as server:
        assert "wss://" in server.output
        asyncio.run(scenario(server.port))
        assert server.stop(signal.SIGTERM, timeout=30) == 0


def test_a_voice_cloned_through_one_front_end_speaks_on_the_other_and_stays_its_keys(tmp_path):
    """Register on one front end (HTTP), use it in a session on the other; list / delete are the key's on both."""
    import requests
    from server_support import espeak


    key_a, key_b = "key-a", "key-b"
    clip = espeak("Hello there, this is my own voice.", tmp_path, rate_hz=22050)

    def voices(port: int, key: str, method: str = "GET", suffix: str = "", **kwargs) -> requests.Response:
        return requests.request(method, f"http://127.0.0.1:{port}/v1/realtime/voices{suffix}", timeout=60,
                                headers={"Authorization": f"Bearer {key}"}, **kwargs)

    def on_each_front_end(port: int, key: str, method: str = "GET", suffix: str = "") -> dict[str, requests.Response]:
        answers: dict[str, requests.Response] = {}
        for _ in range(8):  # consecutive requests alternate between the two (least-loaded hand-off)
            r = voices(port, key, method, suffix)
            answers.setdefault(r.headers[FRONTEND_HEADER], r)
            if len(answers) == 2:
                break
        assert set(answers) == {"0", "1"}, "one front end answered every request"
        return answers

    async def session_on(port: int, key: str, avoid: str) -> WsClient:
        for _ in range(4):
            ws = await connect(f"ws://127.0.0.1:{port}/v1/realtime", additional_headers={"Authorization": f"Bearer {key}"})
            client = WsClient(ws, Dialect.GA)
            assert (await client.recv())["type"] == "session.created"
            if ws.response.headers[FRONTEND_HEADER] != avoid:
                return client
            await ws.close()
        raise AssertionError(f"every session landed on front end {avoid}")

    async def scenario(port: int) -> None:
        import io

        import soundfile as sf

        wav = io.BytesIO()
        sf.write(wav, clip, 22050, subtype="PCM_16", format="WAV")
        r = await asyncio.to_thread(voices, port, key_a, "POST", files={"audio_sample": ("me.wav", wav.getvalue(), "audio/wav")},
                                    data={"transcript": "Hello there, this is my own voice.", "name": "mine"})
        assert r.status_code == 200, r.text
        voice, registered_on = r.json(), r.headers[FRONTEND_HEADER]
        # a session on the other front end speaks in it
        client = await session_on(port, key_a, avoid=registered_on)
        await client.send(type="session.update", session={"type": "realtime", "audio": {"output": {"voice": {"id": voice["id"]}}}})
        updated = (await client.recv_until("session.updated"))[-1]
        assert updated["session"]["audio"]["output"]["voice"] == voice["id"]
        await client.send(type="conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say something."}]})
        await client.send(type="response.create", response={"max_output_tokens": 24})
        frames = await client.recv_until("response.done", timeout=60)
        assert frames[-1]["response"]["status"] in ("completed", "incomplete"), frames[-1]
        assert frames[-1]["response"]["audio"]["output"]["voice"] == voice["id"]
        assert any(f["type"] == "response.output_audio.delta" for f in frames), [f["type"] for f in frames]
        await client.ws.close()
        # the key's list on both front ends; another key sees nothing on either, and cannot use it
        for answer in (await asyncio.to_thread(on_each_front_end, port, key_a)).values():
            assert [v["id"] for v in answer.json()["data"]] == [voice["id"]]
        for answer in (await asyncio.to_thread(on_each_front_end, port, key_b)).values():
            assert answer.status_code == 200 and answer.json()["data"] == []
        for answer in (await asyncio.to_thread(on_each_front_end, port, key_b, "DELETE", "/" + voice["id"])).values():
            assert answer.status_code == 404 and answer.json()["error"]["code"] == "voice_not_found"
        other = await session_on(port, key_b, avoid="none")
        await other.send(type="session.update", session={"type": "realtime", "audio": {"output": {"voice": {"id": voice["id"]}}}})
        assert (await other.expect_error("voice_not_found"))["param"] == "session.audio.output.voice"
        await other.ws.close()
        # deleted through one front end: gone on both
        gone = await asyncio.to_thread(voices, port, key_a, "DELETE", "/" + voice["id"])
        assert gone.json() == {"id": voice["id"], "object": "audio.voice.deleted", "deleted": True}
        for answer in (await asyncio.to_thread(on_each_front_end, port, key_a, "GET", "/" + voice["id"])).values():
            assert answer.status_code == 404 and answer.json()["error"]["code"] == "voice_not_found"

    with served_cli("--set", "server.frontend_processes=2", "--set", f"server.auth.api_keys=[{key_a}, {key_b}]",
                    "--set", "server.voices.max_duration_s=8") as server:
        asyncio.run(scenario(server.port))
        _assert_front_ends_never_loaded_torch(server.proc.pid)
        assert server.stop(signal.SIGTERM, timeout=30) == 0
