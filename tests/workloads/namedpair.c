/* Two named threads of one process that run and block in the same function, for the
 * per-thread labels.
 *
 *   namedpair SECONDS
 *
 * Every 10 ms tick (absolute CLOCK_MONOTONIC times, so neither thread drifts), each thread
 * calls cycle(), which spins on the CPU and then sleeps in nanosleep until the next tick:
 *   - "alpha" (pthread_setname_np) spins 6 ms and sleeps the other 4 ms: 60% on-CPU, 40% off;
 *   - "beta" spins 2 ms and sleeps 8 ms: 20% on-CPU, 80% off.
 * Each thread measures what it did: its CPU time (CLOCK_THREAD_CPUTIME_ID, over the whole
 * thread) and the time it spent inside nanosleep. After SECONDS the program prints
 * "NAME_cpu NANOSECONDS", "NAME_blocked NANOSECONDS" and "NAME_tid TID" per thread, and the
 * wall time, "wall NANOSECONDS".
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define TICK_NS 10000000LL

static long long start_ns;
static long long end_ns;

struct worker {
    const char *name;
    long long spin_ns;
    long long cpu_ns;
    long long blocked_ns;
    pid_t tid;
};

static long long clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Both threads run and block here: only their names tell their time apart. Spins until
 * spin_ns past the tick, then sleeps to the next tick; returns the time slept. */
__attribute__((noinline)) long long cycle(long long tick, long long spin_ns) {
    while (clock_ns(CLOCK_MONOTONIC) < tick + spin_ns) {
        __asm__ volatile("");
    }
    long long left = tick + TICK_NS - clock_ns(CLOCK_MONOTONIC);
    if (left <= 0) {
        return 0;
    }
    struct timespec ts = {0, left};
    long long t0 = clock_ns(CLOCK_MONOTONIC);
    nanosleep(&ts, NULL);
    __asm__ volatile("");
    return clock_ns(CLOCK_MONOTONIC) - t0;
}

static void *run(void *arg) {
    struct worker *w = arg;
    pthread_setname_np(pthread_self(), w->name);
    w->tid = (pid_t)syscall(SYS_gettid);
    for (long long tick = start_ns; tick < end_ns; tick += TICK_NS) {
        w->blocked_ns += cycle(tick, w->spin_ns);
    }
    w->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    return NULL;
}

int main(int argc, char **argv) {
    long long seconds = argc > 1 ? atoll(argv[1]) : 5;
    struct worker workers[] = {
        {"alpha", 6000000, 0, 0, 0},
        {"beta", 2000000, 0, 0, 0},
    };
    pthread_t threads[2];
    /* Start at the next whole tick, far enough ahead that both threads are named by then. */
    start_ns = (clock_ns(CLOCK_MONOTONIC) / TICK_NS + 2) * TICK_NS;
    end_ns = start_ns + seconds * 1000000000LL;
    for (int i = 0; i < 2; i++) {
        if (pthread_create(&threads[i], NULL, run, &workers[i]) != 0) {
            abort();
        }
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(threads[i], NULL);
    }
    for (int i = 0; i < 2; i++) {
        printf("%s_cpu %lld\n%s_blocked %lld\n%s_tid %d\n", workers[i].name, workers[i].cpu_ns,
               workers[i].name, workers[i].blocked_ns, workers[i].name, (int)workers[i].tid);
    }
    printf("wall %lld\n", clock_ns(CLOCK_MONOTONIC) - start_ns);
    return 0;
}
