"""Scale-out on Ray Serve (`pip install realtime-ming[cluster]`): many replicas behind one `/v1/realtime`.

Nothing here is imported by the single-server path; ray is imported only inside the functions
that need it. See docs/cluster.md.
"""
