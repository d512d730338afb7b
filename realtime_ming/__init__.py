"""realtime-ming: a latency-first OpenAI-Realtime voice-agent server for Ming-flash-omni-2.0."""

__version__ = "0.1.0"
