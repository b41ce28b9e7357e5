"""Unit conversions. Each function takes and returns a float."""


def c_to_f(celsius):
    raise NotImplementedError


def km_to_miles(km):
    raise NotImplementedError


def kg_to_pounds(kg):
    raise NotImplementedError


def liters_to_gallons(liters):
    """US gallons."""
    raise NotImplementedError
