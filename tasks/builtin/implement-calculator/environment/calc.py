def evaluate(expression):
    """Value of an arithmetic expression with + - * /, parentheses, unary minus and decimal numbers."""
    raise NotImplementedError
