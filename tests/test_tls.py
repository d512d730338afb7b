"""TLS: with `server.tls` (`--ssl-certfile/--ssl-keyfile`) one port serves `wss://` and `https://`.

A throwaway CA (trustme) signs a certificate for 127.0.0.1; clients trust only that CA, as the
Node `openai` SDK (which always dials wss://) would trust a real one. The WebSocket client completes
a session.update round trip, validated against the openai package's event types; an https GET of
/health answers; a plain-text client is turned away; and the startup line says wss://.
"""

from __future__ import annotations

import asyncio
import json
import ssl

import pytest
from served_cli_support import served_cli
from server_support import seconds, stub_served, validate_frame
from websockets.asyncio.client import connect

from realtime_ming.protocol import Dialect

trustme = pytest.importorskip("trustme")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """(client SSL context trusting the test CA, certfile, keyfile) for 127.0.0.1 and localhost."""
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(certfile), append=True)
    cert.private_key_pem.write_to_path(str(keyfile))
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return client, str(certfile), str(keyfile)


@pytest.fixture
async def tls_server(pki):
    _, certfile, keyfile = pki
    async with stub_served(f"server.tls.certfile={certfile}", f"server.tls.keyfile={keyfile}") as srv:
        yield srv


async def test_wss_session_update_round_trip(tls_server, pki):
    """A wss:// client trusting the CA opens a session and gets its session.update acknowledged."""
    client_ctx, _, _ = pki
    assert tls_server.url == f"wss://127.0.0.1:{tls_server.port}/v1/realtime"
    async with connect(tls_server.url + "?model=ming", ssl=client_ctx) as ws:
        created = json.loads(await asyncio.wait_for(ws.recv(), seconds(5)))
        validate_frame(created, Dialect.GA)
        assert created["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}))
        updated = json.loads(await asyncio.wait_for(ws.recv(), seconds(5)))
        validate_frame(updated, Dialect.GA)
        assert updated["type"] == "session.updated" and updated["session"]["instructions"] == "Be brief."


async def test_https_health(tls_server, pki):
    """HTTP routes are https on the same port: GET /health answers 200 over TLS."""
    client_ctx, _, _ = pki
    reader, writer = await asyncio.open_connection("127.0.0.1", tls_server.port, ssl=client_ctx,
                                                   server_hostname="127.0.0.1")
    writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    await writer.drain()
    reply = await asyncio.wait_for(reader.read(), seconds(5))
    writer.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert json.loads(body)["status"] == "ok"


async def test_plain_client_and_untrusting_client_fail(tls_server):
    """ws:// to a TLS port gets no session; a client that does not trust the CA refuses the certificate."""
    with pytest.raises(Exception):  # noqa: B017 - the server drops the non-TLS bytes; the exact error varies
        async with connect(f"ws://127.0.0.1:{tls_server.port}/v1/realtime", open_timeout=seconds(5)):
            pass
    with pytest.raises(ssl.SSLCertVerificationError):
        async with connect(tls_server.url, ssl=ssl.create_default_context(), open_timeout=seconds(5)):
            pass


@pytest.mark.slow  # the full tier: the CLI in a server process
def test_cli_prints_wss_url(pki):
    """`serve --ssl-certfile/--ssl-keyfile` announces wss:// and answers https /health, then stops on SIGINT."""
    client_ctx, certfile, keyfile = pki
    with served_cli("--ssl-certfile", certfile, "--ssl-keyfile", keyfile, "--set", "session.vad.backend=webrtc") as server:
        assert server.url == f"wss://127.0.0.1:{server.port}/v1/realtime"
        assert server.health(context=client_ctx)["status"] == "ok"
        assert server.stop() == 0
