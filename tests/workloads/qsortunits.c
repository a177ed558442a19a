/* The slowdown bench's worker: sorts through libc's qsort for a fixed time and prints how
 * many sorts it finished, so a profiler's cost shows as work not done. Built -O2
 * -fomit-frame-pointer, like most of what a profiler meets, so perf -g gets short stacks
 * and the walks with unwind tables and DWARF do the real work:
 *
 *   main -> sort_round -> qsort (libc) -> ... -> cmp
 *
 * Work done moves by several percent between runs on a shared machine (the CPUs' speed follows
 * the neighbours'), more than a profiler costs. So the comparator also reads the clock at every
 * CLOCK_EVERY-th call: an interval between two reads longer than GAP_NS is time the worker did
 * not run, an
 * interrupt (a profiler's sample among them) or another task on its CPU. That is counted in
 * time, whatever the CPU's speed, and the gaps' sum over the time between reads is the share of
 * its time the worker lost.
 *
 * Usage: qsortunits SECONDS. Prints one line:
 *   sorts=N gaps=N gap_ns=N covered_ns=N median_gap_ns=N
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N 2048

static volatile unsigned long sink;

/* CLOCK_EVERY calls to the comparator take about 0.1 us; a timer tick in a VM, 5 to 20 us. */
#define CLOCK_EVERY 8
#define GAP_NS 1000
#define KEPT_GAPS (1 << 20)
static unsigned long long previous_read, gaps, gap_ns, covered_ns;
static unsigned int calls;
static unsigned int kept_gaps[KEPT_GAPS];

static unsigned long long clock_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ULL + (unsigned long long)t.tv_nsec;
}

/* Counts the interval since the last read, as a gap when it is one. */
static inline void read_clock(void) {
    unsigned long long now_ns = clock_ns();
    unsigned long long interval = now_ns - previous_read;
    covered_ns += interval;
    if (interval > GAP_NS) {
        gap_ns += interval;
        if (gaps < KEPT_GAPS)
            kept_gaps[gaps] = interval > 0xffffffffULL ? 0xffffffffU : (unsigned int)interval;
        gaps++;
    }
    previous_read = now_ns;
}

__attribute__((noinline)) static int cmp(const void *a, const void *b) {
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
    for (int i = 0; i < 8; i++) {
        x = x * 6364136223846793005UL + 1;
        __asm__ volatile("" : "+r"(x));
    }
    sink = x;
    if (++calls % CLOCK_EVERY == 0)
        read_clock();
    return (*(const unsigned long *)a > y) - (*(const unsigned long *)a < y);
}

__attribute__((noinline)) static void sort_round(unsigned long *values, unsigned long round) {
    for (int i = 0; i < N; i++)
        values[i] = (i * 2654435761UL + round) % 100003;
    /* The refill above is not between two calls: intervals start again here. */
    previous_read = clock_ns();
    qsort(values, N, sizeof values[0], cmp);
}

static double now(void) {
    return clock_ns() / 1e9;
}

static int by_length(const void *a, const void *b) {
    unsigned int x = *(const unsigned int *)a, y = *(const unsigned int *)b;
    return (x > y) - (x < y);
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
    unsigned long kept = gaps < KEPT_GAPS ? gaps : KEPT_GAPS;
    qsort(kept_gaps, kept, sizeof kept_gaps[0], by_length);
    printf("sorts=%lu gaps=%llu gap_ns=%llu covered_ns=%llu median_gap_ns=%u\n", done, gaps,
           gap_ns, covered_ns, kept ? kept_gaps[kept / 2] : 0);
    return 0;
}
