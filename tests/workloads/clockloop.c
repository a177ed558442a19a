/* Reads the clock in a hot loop: most samples land in the vDSO's clock_gettime, called from
 * libc, called from `read_clocks` and `main`. Built without frame pointers, only unwind tables
 * (the vDSO's own, read from memory) find the callers.
 *
 * Usage: clockloop [seconds]. Exits by itself after `seconds` (SIGALRM).
 */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile long sink;

__attribute__((noinline)) static void read_clocks(void) {
    for (;;) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        sink += ts.tv_nsec;
    }
}

int main(int argc, char **argv) {
    alarm(argc > 1 ? atoi(argv[1]) : 30);
    read_clocks();
    return 0;
}
