def dedupe(items):
    """Items without repeats, first occurrence kept, order preserved."""
    return list(set(items))
