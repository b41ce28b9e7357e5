def word_counts(text):
    """Map each word (lower case, punctuation stripped) to the number of times it occurs in ``text``."""
    raise NotImplementedError
