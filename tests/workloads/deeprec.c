/* Recursion as deep as asked, hot at the bottom (deeper than the unwinder's 256-frame limit by
 * default):
 *
 *   main -> descend (x DEPTH) -> spin
 *
 * Built without frame pointers, so only unwind tables find the callers. Every stack is
 * cut at the limit; the test checks that it is counted as truncated and never shows a caller
 * that is not there. Usage: deeprec [depth] [seconds] [vary]; exits by itself (SIGALRM).
 *
 * With `vary`, a stack not seen before each round, as the managed runtimes' deep workloads
 * draw theirs (the walk bench's native row beside theirs): each level calls the next through
 * one of three functions drawn at random for each level of each round, and the bottom spins a
 * few hundred microseconds before the stack is left and climbed again.
 */
#include <stdlib.h>
#include <unistd.h>

volatile unsigned long sink;

/* Iterations of a round's bottom under `vary`: a few hundred microseconds. */
#define ROUND_SPINS 400000UL

/* A macro, not a function: the leaf frame is its user's, spin (the tests look for it) or a
 * `vary` round's bottom step, with no inlined frame of its own. */
#define CHURN(iterations)                                                                      \
    do {                                                                                       \
        unsigned long x = 1;                                                                   \
        for (unsigned long i = 0; i < (iterations); i++) {                                     \
            x = x * 6364136223846793005UL + i;                                                 \
            __asm__ volatile("" : "+r"(x));                                                    \
        }                                                                                      \
        sink = x;                                                                              \
    } while (0)

__attribute__((noinline)) void spin(void) { CHURN(100000000UL); }

__attribute__((noinline)) void descend(int depth) {
    if (depth > 0)
        descend(depth - 1);
    else
        for (;;)
            spin();
    /* Not a tail call: the frame stays. */
    __asm__ volatile("" ::: "memory");
    sink++;
}

/* `vary`'s levels: the order of each round, one of three functions a level. */
static unsigned char *order;
static void (*steps[3])(int);

#define STEP(name)                                                                             \
    __attribute__((noinline)) void name(int level) {                                          \
        if (level > 0)                                                                         \
            steps[order[level - 1]](level - 1);                                                \
        else                                                                                   \
            CHURN(ROUND_SPINS);                                                                \
        __asm__ volatile("" ::: "memory");                                                     \
        sink++;                                                                                \
    }
STEP(step_a)
STEP(step_b)
STEP(step_c)

static void vary(int depth) {
    steps[0] = step_a;
    steps[1] = step_b;
    steps[2] = step_c;
    order = calloc(depth > 0 ? depth : 1, 1);
    if (!order)
        abort();
    for (;;) {
        for (int i = 0; i < depth; i++)
            order[i] = (unsigned char)(random() % 3);
        steps[order[depth - 1]](depth - 1);
    }
}

int main(int argc, char **argv) {
    int depth = argc > 1 ? atoi(argv[1]) : 300;
    alarm(argc > 2 ? atoi(argv[2]) : 30);
    if (argc > 3 && argv[3][0] == 'v') {
        vary(depth > 0 ? depth : 1);
        return 0;
    }
    descend(depth);
    return 0;
}
