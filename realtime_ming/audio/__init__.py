"""Audio stage: PCM codecs, resampling, VAD and turn detection, mel/fbank frontends (pure, no asyncio).

Import from the modules (`audio.pcm`, `audio.resample`, `audio.mel`, `audio.fbank`, `audio.vad`,
`audio.turns`, `audio.config`); this package re-exports nothing so that importing one codec does
not pull in torch or onnxruntime.
"""

__all__: list[str] = []
