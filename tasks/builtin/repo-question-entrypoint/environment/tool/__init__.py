from tool.core import run
