def merge(intervals):
    """Merge overlapping or touching [start, end] intervals; return them sorted by start."""
    raise NotImplementedError
