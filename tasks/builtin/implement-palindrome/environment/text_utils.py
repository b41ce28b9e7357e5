def is_palindrome(text):
    """True when ``text`` reads the same backwards, ignoring case and anything that is not a letter or digit."""
    raise NotImplementedError
