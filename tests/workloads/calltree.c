/* A CPU-bound workload with a known call tree, built with frame pointers by the tests.
 *
 *   main -> dispatch -> run_a -> leaf_a   60% of CPU
 *                    -> run_b -> leaf_b   30%
 *                    -> run_c -> leaf_c   10%
 *
 * Each cycle asks leaf_a for 6 ms of the thread's CPU time, leaf_b for 3 and leaf_c for 1
 * (pace.h: a time, not a count of iterations, so the shares hold on any CPU); each run_*
 * times its leaf from outside it. Usage: calltree [threads] [seconds] [scale]. It exits by
 * itself after `seconds` (SIGALRM), so a failed test never leaves it spinning. `scale`
 * multiplies every leaf's time (default 1).
 *
 * A cycle of fixed length close to a multiple of the sampling period aliases with it: the
 * samples keep landing at the same points of the cycle, and two samplers at the same rate see
 * shares apart by several points. So each cycle's length is drawn at random between half and
 * one and a half of the nominal one, the same factor for the three leaves: every cycle is
 * still 6:3:1, and no period stays in step with it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "pace.h"

volatile unsigned long sink;

static unsigned long scale = 1;
/* This cycle's factor on the nominal length (0.5 to 1.5), and each leaf's pace: per thread,
 * as the thread's own CPU clock times them. */
static __thread double cycle_factor = 1.0;
static __thread struct pace pace_a, pace_b, pace_c;

/* A register-only dependency chain: every iteration costs the same few cycles whatever the
 * loop's alignment or the CPU's store-forwarding tricks. */
#define LEAF(name)                                              \
    __attribute__((noinline)) void name(unsigned long count) {  \
        unsigned long x = 1;                                    \
        /* Forces a frame: GCC 12 drops it in leaf functions even  \
         * with -mno-omit-leaf-frame-pointer, and an unwinder then  \
         * skips the leaf's caller. */                           \
        __asm__ volatile("" : : "r"(__builtin_frame_address(0))); \
        for (unsigned long i = 0; i < count; i++) {             \
            x = x * 6364136223846793005UL + i;                  \
            __asm__ volatile("" : "+r"(x));                     \
        }                                                       \
        sink = x;                                               \
    }

LEAF(leaf_a)
LEAF(leaf_b)
LEAF(leaf_c)

/* Nanoseconds of CPU time a leaf is asked for this cycle. */
static long long cycle_ns(long long nominal_ms) {
    return (long long)(nominal_ms * 1000000.0 * scale * cycle_factor);
}

__attribute__((noinline)) void run_a(void) { PACED(&pace_a, cycle_ns(6), leaf_a(count)); __asm__ volatile(""); }
__attribute__((noinline)) void run_b(void) { PACED(&pace_b, cycle_ns(3), leaf_b(count)); __asm__ volatile(""); }
__attribute__((noinline)) void run_c(void) { PACED(&pace_c, cycle_ns(1), leaf_c(count)); __asm__ volatile(""); }

__attribute__((noinline)) void dispatch(void) {
    /* xorshift64, seeded per thread: reproducible, and threads out of step with each other. */
    static unsigned long threads_started;
    unsigned long thread = __atomic_fetch_add(&threads_started, 1, __ATOMIC_RELAXED);
    unsigned long state = 0x9E3779B97F4A7C15UL * (thread + 1);
    for (;;) {
        cycle_factor = pace_jitter(&state);
        run_a();
        run_b();
        run_c();
    }
}

static void *thread_main(void *arg) {
    (void)arg;
    dispatch();
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    int seconds = argc > 2 ? atoi(argv[2]) : 30;
    if (argc > 3 && atoi(argv[3]) > 0) {
        scale = (unsigned long)atoi(argv[3]);
    }
    alarm(seconds);
    for (int i = 1; i < threads; i++) {
        pthread_t thread;
        pthread_create(&thread, NULL, thread_main, NULL);
    }
    dispatch();
    return 0;
}
