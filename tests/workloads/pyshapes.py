"""Stack shapes the Python walk must get right, each in a thread of its own, for the Python
walk's tests. `python3 pyshapes.py SECONDS`.

- `hashing`: `hash_loop` calls `hashlib.sha256` on 32 MiB at a time. The hash runs in
  libcrypto with the GIL released (long enough that waiting for the GIL again between calls
  is a small part), so its samples are native frames under Python callers.
- `recursion`: `recurse` calls itself 200 times, then `deep_leaf` spins: a stack deeper than
  a walk may emit, which must come out whole or counted as truncated, never with a wrong caller.
- the main thread: `main_spin`, a third function, told apart from the other two.
"""

import hashlib
import sys
import threading
import time

DATA = bytes(range(256)) * 131072


def hash_loop(end):
    digest = b""
    while time.monotonic() < end:
        digest = hashlib.sha256(DATA).digest()
    return digest


def deep_leaf(end):
    total = 0
    while time.monotonic() < end:
        for i in range(2000):
            total += i * i
    return total


def recurse(depth, end):
    if depth == 0:
        return deep_leaf(end)
    return recurse(depth - 1, end)


def recursion_main(end):
    return recurse(199, end)


def main_spin(end):
    total = 0
    while time.monotonic() < end:
        for i in range(2000):
            total ^= i
    return total


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    end = time.monotonic() + seconds
    sys.setrecursionlimit(1000)
    threads = [
        threading.Thread(target=hash_loop, args=(end,), name="hashing"),
        threading.Thread(target=recursion_main, args=(end,), name="recursion"),
    ]
    for thread in threads:
        thread.start()
    main_spin(end)
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
