def average(values):
    """Arithmetic mean of ``values``; 0.0 for an empty sequence."""
    return sum(values) / len(values)
