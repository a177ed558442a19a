"""A Python call tree with known shares, for the Python walk's tests.

main -> run -> {parse, compute -> {matmul, reduce}, digest}. Each leaf calls the same `spin`
until its share of a round's CPU time has passed on the thread's clock, so the shares of
samples are set by time, on any CPU (parse 1, matmul 3, reduce 2, digest 1 parts of 7).
`python3 calltree.py SECONDS`.

A round's length varies at random around its mean: rounds of one fixed length would beat
against a profiler's fixed sampling period and skew the shares it sees by a few points, a
different few for each profiler.
"""

import random
import sys
import time

# Iterations of one call of `spin`: a short call (tens of microseconds), so a leaf overshoots
# its time by little, and the clock's read between calls is a small part of the leaf's time.
CHUNK = 400


def spin(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def parse(seconds):
    total, end = 0, time.thread_time() + seconds
    while time.thread_time() < end:
        total += spin(CHUNK)
    return total


def matmul(seconds):
    total, end = 0, time.thread_time() + 3 * seconds
    while time.thread_time() < end:
        total += spin(CHUNK)
    return total


def reduce(seconds):
    total, end = 0, time.thread_time() + 2 * seconds
    while time.thread_time() < end:
        total += spin(CHUNK)
    return total


def compute(seconds):
    return matmul(seconds) + reduce(seconds)


def digest(seconds):
    total, end = 0, time.thread_time() + seconds
    while time.thread_time() < end:
        total += spin(CHUNK)
    return total


def run(seconds, mean):
    rounds = random.Random(1)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        part = rounds.uniform(mean / 2, mean * 3 / 2)
        parse(part)
        compute(part)
        digest(part)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    # One part of seven: a round of about 14 ms of CPU time.
    run(seconds, 0.002)


if __name__ == "__main__":
    main()
