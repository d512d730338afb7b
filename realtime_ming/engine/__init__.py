"""Engine stage: thinker runner, segmenter, talker runner, streaming VAE, the GPU thread and its queues."""
