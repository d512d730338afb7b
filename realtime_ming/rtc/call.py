"""Answering one WebRTC offer: an aiortc peer connection whose data channel and tracks form a call.

`answer_offer(sdp, ...)` checks the offer (it must open a data channel: the events travel there), creates the
peer connection with the server's output track on the offer's audio m-line (Opus preferred), and returns the
`Call` once the answer is ready (ICE candidates gathered: the answer carries them, no trickle). The call's
`transport` (the `oai-events` channel) and `media` (the tracks) are then served like a WebSocket session.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCRtpSender, RTCSessionDescription

from .channel import DataChannelTransport, peer_max_message
from .media import CallMedia

__all__ = ["CALL_ID_PREFIX", "Call", "OfferError", "answer_offer"]

log = logging.getLogger(__name__)
if logging.getLogger("aioice").level == logging.NOTSET:  # ~10 INFO lines of ICE checks per call otherwise
    logging.getLogger("aioice").setLevel(logging.WARNING)

CALL_ID_PREFIX = "rtc_"


class OfferError(ValueError):
    """An SDP offer this server cannot answer (the message says why)."""


@dataclass(slots=True)
class Call:
    """An answered call: its id, peer connection, event channel, media path and the answer to send."""

    id: str
    pc: RTCPeerConnection
    transport: DataChannelTransport
    media: CallMedia
    answer_sdp: str

    async def hang_up(self, reason: str = "hung up") -> None:
        """End the call (the session sees its transport close)."""
        self.transport.end(reason)
        await self.pc.close()


def _check_offer(sdp: str) -> None:
    if not sdp.lstrip().startswith("v=0"):
        raise OfferError("the body is not an SDP offer (it must start with v=0)")
    media = [line.split()[0][2:] for line in sdp.splitlines() if line.startswith("m=") and line.split()]
    if "application" not in media:
        raise OfferError("the offer opens no data channel: create the 'oai-events' data channel before the offer")
    if any(kind not in ("audio", "application") for kind in media):
        raise OfferError(f"the offer has m-lines this server does not take ({', '.join(media)}): audio and one "
                         "data channel only")


def _prefer_opus(pc: RTCPeerConnection) -> None:
    opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"]
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            transceiver.setCodecPreferences(opus)


async def answer_offer(offer_sdp: str, *, ice_servers: Sequence[str] = (), connect_timeout_s: float = 20.0) -> Call:
    """Answer `offer_sdp`; raises OfferError for an offer that cannot be answered."""
    _check_offer(offer_sdp)
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[RTCIceServer(urls=url) for url in ice_servers]))
    try:
        media = CallMedia()
        transport = DataChannelTransport(pc, max_message_bytes=peer_max_message(offer_sdp),
                                         connect_timeout_s=connect_timeout_s)

        @pc.on("datachannel")
        def on_datachannel(channel) -> None:
            if not transport.attach(channel):
                log.debug("ignoring data channel %r", channel.label)

        @pc.on("track")
        def on_track(track) -> None:
            if track.kind == "audio":
                media.set_mic(track)

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                transport.end(f"the peer connection {pc.connectionState}")

        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except (ValueError, KeyError, IndexError) as exc:
            raise OfferError(f"the SDP offer could not be read: {exc}") from None
        if any(t.kind == "audio" for t in pc.getTransceivers()):
            pc.addTrack(media.track)
            if "opus" in offer_sdp.lower():
                _prefer_opus(pc)
        try:
            await pc.setLocalDescription(await pc.createAnswer())
        except (ValueError, RuntimeError) as exc:  # e.g. no codec in common
            raise OfferError(f"the offer cannot be answered: {exc}") from None
    except BaseException:
        await asyncio.shield(pc.close())
        raise
    return Call(CALL_ID_PREFIX + uuid.uuid4().hex, pc, transport, media, pc.localDescription.sdp)
