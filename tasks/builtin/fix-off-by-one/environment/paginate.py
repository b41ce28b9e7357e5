"""Split a list into pages."""


def page(items, number, size):
    """Return page ``number`` (1-based) of ``items`` with ``size`` items per page."""
    start = number * size
    return items[start:start + size]
