/* Threads that block in known places for known shares of the time, for off-CPU profiling.
 *
 *   blocker SECONDS
 *
 * Every 10 ms tick (absolute CLOCK_MONOTONIC times, so no thread drifts):
 *   - "sleeper" sleeps 6 ms in sleep_in_nanosleep (nanosleep), 60%;
 *   - "reader" blocks in read_from_pipe (read) until "feeder" writes a byte at the tick, after
 *     resting until 7 ms past the previous tick: 30%;
 *   - "waiter" blocks in wait_for_mutex (pthread_mutex_lock) from 4 ms past the tick until
 *     "holder", which locks it at the tick, unlocks it at 5 ms: 10%;
 *   - "mover" sleeps in sleep_across_cpus pinned to CPU 0 for 8 ms of each tick while
 *     "pinner" moves it to CPU 1 halfway: it wakes on another CPU than it slept on, 80%.
 * And "napper" sleeps once for 2 s in sleep_long, 3 s after the start, then 10,000 times for
 * 100 us in sleep_short: one long block among many short ones.
 * Between, each rests in rest() (clock_nanosleep to an absolute time). Each thread measures
 * the time it spends inside its blocking call and, after SECONDS, the program prints
 * "FUNCTION NANOSECONDS" per function and the wall time, "wall NANOSECONDS".
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define TICK_NS 10000000LL

static long long start_ns;
static long long end_ns;
static int pipe_fds[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile long long blocked_sleep, blocked_pipe, blocked_mutex, blocked_moved;
static volatile long long blocked_long, blocked_short;
static volatile pid_t mover_tid;
static int cpus;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static struct timespec at(long long ns) {
    struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
    return ts;
}

__attribute__((noinline)) void rest(long long until) {
    struct timespec ts = at(until);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
    __asm__ volatile("");
}

__attribute__((noinline)) long long sleep_in_nanosleep(void) {
    struct timespec ts = {0, 6000000};
    long long t0 = now_ns();
    nanosleep(&ts, NULL);
    __asm__ volatile("");
    return now_ns() - t0;
}

__attribute__((noinline)) long long read_from_pipe(void) {
    char byte;
    long long t0 = now_ns();
    if (read(pipe_fds[0], &byte, 1) != 1) {
        abort();
    }
    __asm__ volatile("");
    return now_ns() - t0;
}

__attribute__((noinline)) long long wait_for_mutex(void) {
    long long t0 = now_ns();
    pthread_mutex_lock(&lock);
    long long blocked = now_ns() - t0;
    pthread_mutex_unlock(&lock);
    __asm__ volatile("");
    return blocked;
}

__attribute__((noinline)) long long sleep_across_cpus(void) {
    struct timespec ts = {0, 8000000};
    long long t0 = now_ns();
    nanosleep(&ts, NULL);
    __asm__ volatile("");
    return now_ns() - t0;
}

__attribute__((noinline)) long long sleep_long(void) {
    struct timespec ts = {2, 0};
    long long t0 = now_ns();
    nanosleep(&ts, NULL);
    __asm__ volatile("");
    return now_ns() - t0;
}

__attribute__((noinline)) long long sleep_short(void) {
    struct timespec ts = {0, 100000};
    long long t0 = now_ns();
    nanosleep(&ts, NULL);
    __asm__ volatile("");
    return now_ns() - t0;
}

static void *napper(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "napper");
    rest(start_ns + 3000000000LL);
    blocked_long += sleep_long();
    for (int i = 0; i < 10000 && now_ns() < end_ns; i++) {
        blocked_short += sleep_short();
    }
    return NULL;
}

static void pin(pid_t tid, int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(tid, sizeof set, &set);
}

static void *sleeper(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "sleeper");
    for (long long tick = start_ns; tick < end_ns; tick += TICK_NS) {
        rest(tick);
        blocked_sleep += sleep_in_nanosleep();
    }
    return NULL;
}

static void *feeder(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "feeder");
    for (long long tick = start_ns + TICK_NS; tick <= end_ns + TICK_NS; tick += TICK_NS) {
        rest(tick);
        if (write(pipe_fds[1], "x", 1) != 1) {
            abort();
        }
    }
    return NULL;
}

static void *reader(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "reader");
    for (long long tick = start_ns; tick < end_ns; tick += TICK_NS) {
        rest(tick + 7000000);
        blocked_pipe += read_from_pipe();
    }
    return NULL;
}

static void *holder(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "holder");
    for (long long tick = start_ns; tick < end_ns; tick += TICK_NS) {
        rest(tick);
        pthread_mutex_lock(&lock);
        rest(tick + 5000000);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

static void *waiter(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "waiter");
    for (long long tick = start_ns; tick < end_ns; tick += TICK_NS) {
        rest(tick + 4000000);
        blocked_mutex += wait_for_mutex();
    }
    return NULL;
}

static void *mover(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "mover");
    mover_tid = (pid_t)syscall(SYS_gettid);
    for (long long tick = start_ns; tick < end_ns; tick += TICK_NS) {
        rest(tick);
        pin(0, 0);
        blocked_moved += sleep_across_cpus();
    }
    return NULL;
}

static void *pinner(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "pinner");
    for (long long tick = start_ns; tick < end_ns; tick += TICK_NS) {
        rest(tick + 4000000);
        if (mover_tid != 0) {
            pin(mover_tid, 1);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 10;
    cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (pipe(pipe_fds) != 0) {
        return 1;
    }
    /* Start at the next tick after a short settling time. */
    start_ns = (now_ns() / TICK_NS + 10) * TICK_NS;
    end_ns = start_ns + seconds * 1000000000LL;
    void *(*bodies[])(void *) = {sleeper, feeder, reader, holder, waiter, napper, mover, pinner};
    int threads = cpus >= 2 ? 8 : 6;
    pthread_t ids[8];
    for (int i = 0; i < threads; i++) {
        pthread_create(&ids[i], NULL, bodies[i], NULL);
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(ids[i], NULL);
    }
    long long wall = now_ns() - start_ns;
    printf("sleep_in_nanosleep %lld\nread_from_pipe %lld\nwait_for_mutex %lld\n"
           "sleep_across_cpus %lld\nsleep_long %lld\nsleep_short %lld\nwall %lld\n",
           blocked_sleep, blocked_pipe, blocked_mutex, blocked_moved, blocked_long,
           blocked_short, wall);
    return 0;
}
