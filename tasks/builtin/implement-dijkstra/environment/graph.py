def shortest_path(graph, start, goal):
    """Cheapest path from ``start`` to ``goal``.

    ``graph`` maps a node to a dict of {neighbour: non-negative edge cost}. Returns (cost, [start, ..., goal]),
    or None when ``goal`` cannot be reached.
    """
    raise NotImplementedError
