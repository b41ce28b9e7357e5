from shop.codes import rate_for


def apply_discount(amount, code):
    return round(amount * (1 - rate_for(code)), 2)
