"""Embedding SDK: RealtimeClient (over a socket) and LocalAgent (in-process), one event stream."""
