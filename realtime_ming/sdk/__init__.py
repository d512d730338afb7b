"""Embedding SDK: `RealtimeClient` (over a socket) and `LocalAgent` (in-process), one typed event stream.

Both are `RealtimeAgent`s: the same calls (`update_session`, `send_audio`, `commit`,
`create_response`, `cancel`, `truncate`, `add_text`, `add_image`, `collect_turn`, …) and the same
`realtime_ming.protocol` server events from `recv()` / `async for`; with a session `transcription`,
`agent.transcripts` holds the user's transcripts by item id (`await agent.transcripts.wait(item_id)`).
Errors: see `sdk.errors`.
"""

from .agent import UNSET, AgentOptions, Opening, RealtimeAgent
from .audio import AudioInput, read_audio_file, save_wav
from .client import ClientOptions, RealtimeClient, ReconnectPolicy, realtime_url
from .errors import (
    AuthenticationError,
    ConnectError,
    ConnectionClosed,
    ProtocolViolation,
    RealtimeError,
    ServerError,
)
from .events import parse_server_event
from .local import LocalAgent
from .transcripts import Transcript, TranscriptionFailed, Transcripts
from .turn import TurnResult, TurnTimings
from .voices import RegisteredVoice, VoiceError, delete_voice, list_voices, register_voice

__all__ = [
    "UNSET",
    "AgentOptions",
    "AudioInput",
    "AuthenticationError",
    "ClientOptions",
    "ConnectError",
    "ConnectionClosed",
    "LocalAgent",
    "Opening",
    "ProtocolViolation",
    "RealtimeAgent",
    "RealtimeClient",
    "RealtimeError",
    "ReconnectPolicy",
    "RegisteredVoice",
    "ServerError",
    "Transcript",
    "TranscriptionFailed",
    "Transcripts",
    "TurnResult",
    "TurnTimings",
    "VoiceError",
    "delete_voice",
    "list_voices",
    "parse_server_event",
    "read_audio_file",
    "realtime_url",
    "register_voice",
    "save_wav",
]
