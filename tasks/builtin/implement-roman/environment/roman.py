def to_roman(number):
    """Roman numeral for 1 <= number <= 3999; ValueError outside that range."""
    raise NotImplementedError
