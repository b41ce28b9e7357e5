import sys

from tool.core import run


def launch():
    sys.exit(run(sys.argv[1:]))
