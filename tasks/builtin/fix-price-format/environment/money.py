def format_price(cents):
    """Format an amount in cents as dollars, e.g. 350 -> "$3.50", 5 -> "$0.05", -1999 -> "-$19.99"."""
    return "$" + str(cents / 100)
