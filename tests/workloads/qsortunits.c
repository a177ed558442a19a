/* The slowdown bench's worker: sorts through libc's qsort for a fixed time and prints how
 * many sorts it finished, so a profiler's cost shows as work not done. Built -O2
 * -fomit-frame-pointer, like most of what a profiler meets, so perf -g gets short stacks
 * and the walks with unwind tables and DWARF do the real work:
 *
 *   main -> sort_round -> qsort (libc) -> ... -> cmp
 *
 * Usage: qsortunits SECONDS. Prints the number of sorts done.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N 2048

static volatile unsigned long sink;

__attribute__((noinline)) static int cmp(const void *a, const void *b) {
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
    for (int i = 0; i < 8; i++) {
        x = x * 6364136223846793005UL + 1;
        __asm__ volatile("" : "+r"(x));
    }
    sink = x;
    return (*(const unsigned long *)a > y) - (*(const unsigned long *)a < y);
}

__attribute__((noinline)) static void sort_round(unsigned long *values, unsigned long round) {
    for (int i = 0; i < N; i++)
        values[i] = (i * 2654435761UL + round) % 100003;
    qsort(values, N, sizeof values[0], cmp);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 8;
    static unsigned long values[N];
    unsigned long done = 0;
    double end = now() + seconds;
    /* A sort takes about a hundred microseconds: checking the clock after each costs
     * nothing measurable and ends the run within one. */
    while (now() < end)
        sort_round(values, done++);
    printf("%lu\n", done);
    return 0;
}
