class LRUCache:
    """A fixed-capacity cache that evicts the least recently used key."""

    def __init__(self, capacity):
        raise NotImplementedError

    def get(self, key):
        """The value for ``key`` (marking it most recently used), or None."""
        raise NotImplementedError

    def put(self, key, value):
        """Store ``value``; evict the least recently used key when over capacity."""
        raise NotImplementedError
