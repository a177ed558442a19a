/* One of the many sleepy processes of `cargo xtask bench --only scale`: it sleeps most of the
 * time and wakes now and then to do a little work through a few functions and libc's qsort:
 *
 *   main -> doze -> wake -> sort_round -> qsort (libc) -> ... -> compare
 *
 *   dozer PERIOD_MS WORK_US SECONDS [BURST_MS]
 *
 * Each sleep lasts PERIOD_MS times a random factor between 0.5 and 1.5 (seeded by the pid), so
 * hundreds of copies started together do not wake in lockstep; each wake does WORK_US of CPU
 * time. First, BURST_MS of work (default 60, a little more than a sampling period at 19 Hz),
 * under SCHED_FIFO when allowed (as root): alone on its CPU, whatever else the host runs, so
 * that CPU's next sample finds it and a profiler meets every process as it starts, as one that
 * has run for a while has met them all. Exits by itself after SECONDS (SIGALRM), so a failed
 * bench leaves nothing running.
 *
 * Built -O2 -fomit-frame-pointer: walks need unwind tables. The bench links the same object
 * many times with distinct build ids (`-Wl,--build-id=0x...`), so each copy is a different
 * binary to the profiler.
 */
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define VALUES 256

static volatile unsigned long sink;

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

__attribute__((noinline)) static int compare(const void *a, const void *b) {
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
    /* A little work in the comparator, so samples land below libc's frames. */
    for (int i = 0; i < 8; i++) {
        x = x * 6364136223846793005UL + 1;
        __asm__ volatile("" : "+r"(x));
    }
    sink ^= x;
    return (*(const unsigned long *)a > y) - (*(const unsigned long *)a < y);
}

__attribute__((noinline)) static void sort_round(unsigned long *values, unsigned long seed) {
    for (int i = 0; i < VALUES; i++)
        values[i] = (i * 2654435761UL + seed) % 100003;
    qsort(values, VALUES, sizeof values[0], compare);
}

/* Sorts rounds until `ms` of CPU time have passed. */
__attribute__((noinline)) static void wake(unsigned long *values, double ms, unsigned long *seed) {
    double end = cpu_ms() + ms;
    do {
        sort_round(values, (*seed)++);
    } while (cpu_ms() < end);
}

/* `ms` of work alone on a CPU: SCHED_FIFO (when allowed), then back to SCHED_OTHER. */
__attribute__((noinline)) static void burst(double ms) {
    static unsigned long values[VALUES];
    unsigned long seed = 1;
    struct sched_param fifo = {.sched_priority = 1}, other = {.sched_priority = 0};
    int raised = sched_setscheduler(0, SCHED_FIFO, &fifo) == 0;
    wake(values, ms, &seed);
    if (raised)
        sched_setscheduler(0, SCHED_OTHER, &other);
}

__attribute__((noinline)) static void doze(long period_ms, double work_ms) {
    static unsigned long values[VALUES];
    unsigned long seed = (unsigned long)getpid();
    for (;;) {
        /* 0.5 to 1.5 times the period. */
        long ms = period_ms / 2 + rand() % (period_ms + 1);
        struct timespec nap = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&nap, NULL);
        wake(values, work_ms, &seed);
    }
}

int main(int argc, char **argv) {
    if (argc < 4)
        return 2;
    long period_ms = atol(argv[1]);
    double work_ms = atol(argv[2]) / 1e3;
    int seconds = atoi(argv[3]);
    double burst_ms = argc > 4 ? atol(argv[4]) : 60;
    if (period_ms < 1)
        return 2;
    alarm(seconds);
    srand((unsigned)getpid());
    burst(burst_ms);
    doze(period_ms, work_ms);
    return 0;
}
