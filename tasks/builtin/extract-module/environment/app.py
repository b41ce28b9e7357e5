import re

EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$", re.IGNORECASE)


def validate_email(address):
    return bool(EMAIL.match(address))


def validate_phone(number):
    digits = [c for c in number if c.isdigit()]
    return 7 <= len(digits) <= 15 and all(c.isdigit() or c in " +-()" for c in number)


def signup(email, phone):
    if not validate_email(email):
        return "bad email"
    if not validate_phone(phone):
        return "bad phone"
    return "ok"
