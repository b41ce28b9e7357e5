def greeting():
    return "Helo, world"


if __name__ == "__main__":
    print(greeting())
