def get_path(data, path, default=None):
    """Value at ``path`` in nested dicts/lists, e.g. "users[1].name"; ``default`` when any step is missing."""
    raise NotImplementedError
