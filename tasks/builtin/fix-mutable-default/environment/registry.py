def register(name, registry=[]):
    """Add ``name`` to ``registry`` (a new list when none is given) and return the registry."""
    registry.append(name)
    return registry
