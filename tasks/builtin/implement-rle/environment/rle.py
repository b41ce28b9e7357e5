def encode(text):
    """Run-length encode: "aaabcc" -> "3a1b2c"."""
    raise NotImplementedError


def decode(encoded):
    """Inverse of encode: "3a1b2c" -> "aaabcc". ValueError on malformed input."""
    raise NotImplementedError
