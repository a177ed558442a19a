/* A CPU-bound workload with a known call tree, built with frame pointers by the tests.
 *
 *   main -> dispatch -> run_a -> leaf_a   60% of CPU
 *                    -> run_b -> leaf_b   30%
 *                    -> run_c -> leaf_c   10%
 *
 * Each leaf runs the same loop body, so CPU shares follow the iteration counts 6:3:1.
 * Usage: calltree [threads] [seconds] [scale]. It exits by itself after `seconds` (SIGALRM),
 * so a failed test never leaves it spinning. `scale` multiplies every leaf's count (default 1,
 * a cycle of about 13 ms here).
 *
 * A cycle of fixed length close to a multiple of the sampling period aliases with it: the
 * samples keep landing at the same points of the cycle, and two samplers at the same rate saw
 * shares apart by 0.08 (0.646 against 0.567 for leaf_a at 199 Hz). Under qemu's TCG, where a
 * cycle's length follows the host's speed, a CI run saw 0.58/0.36/0.06. So each cycle's length
 * is drawn at random between half and one and a half of the nominal one, the same factor for
 * the three leaves: every cycle is still 6:3:1, and no period stays in step with it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

volatile unsigned long sink;

/* A register-only dependency chain: every iteration costs the same few cycles whatever the
 * loop's alignment or the CPU's store-forwarding tricks, so time is proportional to the count. */
static unsigned long scale = 1;
/* This cycle's length, in thousandths of the nominal one (500 to 1499). */
static __thread unsigned long cycle_permille = 1000;

#define LEAF(name, iterations)                                  \
    __attribute__((noinline)) void name(void) {                 \
        unsigned long x = 1;                                    \
        /* Forces a frame: GCC 12 drops it in leaf functions even  \
         * with -mno-omit-leaf-frame-pointer, and an unwinder then  \
         * skips the leaf's caller. */                           \
        __asm__ volatile("" : : "r"(__builtin_frame_address(0))); \
        for (unsigned long i = 0; i < (iterations) * scale / 1000 * cycle_permille; i++) { \
            x = x * 6364136223846793005UL + i;                  \
            __asm__ volatile("" : "+r"(x));                     \
        }                                                       \
        sink = x;                                               \
    }

LEAF(leaf_a, 6000000UL)
LEAF(leaf_b, 3000000UL)
LEAF(leaf_c, 1000000UL)

__attribute__((noinline)) void run_a(void) { leaf_a(); __asm__ volatile(""); }
__attribute__((noinline)) void run_b(void) { leaf_b(); __asm__ volatile(""); }
__attribute__((noinline)) void run_c(void) { leaf_c(); __asm__ volatile(""); }

__attribute__((noinline)) void dispatch(void) {
    /* xorshift64, seeded per thread: reproducible, and threads out of step with each other. */
    static unsigned long threads_started;
    unsigned long thread = __atomic_fetch_add(&threads_started, 1, __ATOMIC_RELAXED);
    unsigned long state = 0x9E3779B97F4A7C15UL * (thread + 1);
    for (;;) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        cycle_permille = 500 + state % 1000;
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
