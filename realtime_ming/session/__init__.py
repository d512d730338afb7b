"""Session stage: the per-connection Realtime state machine (Sans-I/O)."""
