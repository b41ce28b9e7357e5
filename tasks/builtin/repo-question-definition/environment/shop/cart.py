from shop.pricing import apply_discount


def total(items, code=None):
    return apply_discount(sum(price for _, price in items), code)
