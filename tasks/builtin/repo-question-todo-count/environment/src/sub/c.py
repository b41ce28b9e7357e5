def c():
    # TODO(ana): cache this
    # todo lower case does not count
    return 3
