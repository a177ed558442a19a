/* Spins in before_exec for `seconds`, then replaces itself with `program args...` (same pid):
 * the unwinder must drop the old image's mappings and learn the new ones.
 * Usage: execer seconds program [args...] */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void before_exec(double seconds) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        for (unsigned long i = 0; i < 100000; i++) sink += i * i;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    before_exec(atof(argv[1]));
    execv(argv[2], argv + 2);
    return 1;
}
