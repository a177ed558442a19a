"""A Python stack of a set depth, for the Python walk's cost bench: `pydepth.py DEPTH SECONDS`
spins in a function DEPTH Python frames deep (counting `<module>`) until SECONDS have passed.
"""

import sys
import time


def leaf(end):
    total = 0
    while time.monotonic() < end:
        for i in range(2000):
            total += i
    return total


def down(n, end):
    if n == 0:
        return leaf(end)
    return down(n - 1, end)


down(int(sys.argv[1]) - 2, time.monotonic() + float(sys.argv[2]))
