/* An always-inline function doing the hot loop, inlined into a noinline caller: every sample
 * lands in `spin_caller`'s machine code, and only DWARF's inline records say that the loop is
 * `inlined_spin`'s, called from `spin_caller` at the marked line.
 *
 * The test finds the marked lines (LOOP_LINE, CALL_LINE) in this file, so lines may move.
 * Usage: inline [seconds]. Exits by itself after `seconds` (SIGALRM).
 */
#include <stdlib.h>
#include <unistd.h>

volatile unsigned long sink;

static inline __attribute__((always_inline)) unsigned long inlined_spin(unsigned long n) {
    unsigned long x = 1;
    /* The whole loop on one line, so every instruction of it carries this line. */
    for (unsigned long i = 0; i < n; i++) { x = x * 6364136223846793005UL + i; __asm__ volatile("" : "+r"(x)); } /* LOOP_LINE */
    return x;
}

__attribute__((noinline)) void spin_caller(unsigned long n) {
    /* Forces a frame: GCC 12 drops it in leaf functions even with
     * -mno-omit-leaf-frame-pointer, and an unwinder then skips the leaf's caller. */
    __asm__ volatile("" : : "r"(__builtin_frame_address(0)));
    for (;;) {
        sink = inlined_spin(n); /* CALL_LINE */
    }
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 30;
    alarm(seconds);
    /* From the command line, so the compiler cannot specialise the loop on a constant. */
    spin_caller(argc > 2 ? strtoul(argv[2], NULL, 10) : 1000000UL);
    return 0;
}
