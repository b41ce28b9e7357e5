def build_order(deps):
    """Order to build packages in.

    ``deps`` maps each package to the list of packages it depends on (which may not be keys themselves).
    Returns a list with every package (keys and dependencies) where each package comes after all of its
    dependencies; among packages that are ready at the same time, the alphabetically smallest comes first.
    Raises ValueError naming a package on a cycle when there is one.
    """
    raise NotImplementedError
