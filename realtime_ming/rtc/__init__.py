"""WebRTC calls (`POST /v1/realtime/calls`): aiortc peer connections whose `oai-events` data channel and Opus
audio tracks drive the same session machine as the WebSocket path (`server/connection.py`)."""
