"""A Python call tree with known shares, for the Python walk's tests.

main -> run -> {parse, compute -> {matmul, reduce}, digest}. Each leaf calls the same
`spin` a fixed number of times per round, so the shares of samples are set by the work
(parse 1, matmul 3, reduce 2, digest 1 parts of 7). `python3 calltree.py SECONDS`.

A round's size varies at random around its mean: rounds of one fixed length would beat
against a profiler's fixed sampling period and skew the shares it sees by a few points, a
different few for each profiler.
"""

import random
import sys
import time


def spin(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def parse(n):
    return spin(n)


def matmul(n):
    return spin(n) + spin(n) + spin(n)


def reduce(n):
    return spin(n) + spin(n)


def compute(n):
    return matmul(n) + reduce(n)


def digest(n):
    return spin(n)


def run(seconds, mean):
    rounds = random.Random(1)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        n = rounds.randrange(mean // 2, mean * 3 // 2)
        parse(n)
        compute(n)
        digest(n)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    run(seconds, 20000)


if __name__ == "__main__":
    main()
