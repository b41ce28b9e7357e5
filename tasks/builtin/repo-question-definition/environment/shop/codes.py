RATES = {"SPRING": 0.1, "VIP": 0.25}


def rate_for(code):
    return RATES.get(code, 0.0)
