#!/usr/bin/env bash
# Oracle solution for implement-calculator.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > calc.py <<'EOF'
import re

_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?|\.\d+)|(.))")


def _tokens(text):
    out = []
    for number, op in _TOKEN.findall(text):
        if number:
            out.append(float(number))
        elif op.strip():
            if op not in "+-*/()":
                raise ValueError(f"unexpected character {op!r}")
            out.append(op)
    return out


def evaluate(expression):
    """Value of an arithmetic expression with + - * /, parentheses, unary minus and decimal numbers."""
    tokens = _tokens(expression)
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError("unexpected end of expression")
        pos += 1
        return tokens[pos - 1]

    def expr():
        value = term()
        while peek() in ("+", "-"):
            value = value + term() if take() == "+" else value - term()
        return value

    def term():
        value = factor()
        while peek() in ("*", "/"):
            value = value * factor() if take() == "*" else value / factor()
        return value

    def factor():
        tok = take()
        if tok == "-":
            return -factor()
        if tok == "(":
            value = expr()
            if take() != ")":
                raise ValueError("missing )")
            return value
        if isinstance(tok, float):
            return tok
        raise ValueError(f"unexpected {tok!r}")

    value = expr()
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r}")
    return float(value)
EOF
