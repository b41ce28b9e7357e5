# TODO: handle unicode
def a():
    return 1  # TODO remove
