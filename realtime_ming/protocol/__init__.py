"""Protocol stage: typed OpenAI Realtime events (GA + beta aliases), parse/serialise, error codes."""
