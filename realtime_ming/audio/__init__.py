"""Audio stage: PCM codecs, resampling, VAD and turn detection, mel/fbank frontends (pure, no asyncio)."""
