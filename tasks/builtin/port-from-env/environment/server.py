def get_port():
    """The port to listen on."""
    return 8000
