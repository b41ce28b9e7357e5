def run(args):
    print("running with", args)
    return 0
