/* Recursion as deep as asked, hot at the bottom (deeper than the unwinder's 256-frame limit by
 * default):
 *
 *   main -> descend (x DEPTH) -> spin
 *
 * Built without frame pointers, so only unwind tables find the callers. Every stack is
 * cut at the limit; the test checks that it is counted as truncated and never shows a caller
 * that is not there. Usage: deeprec [depth] [seconds]; exits by itself (SIGALRM).
 */
#include <stdlib.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void spin(void) {
    unsigned long x = 1;
    for (unsigned long i = 0; i < 100000000UL; i++) {
        x = x * 6364136223846793005UL + i;
        __asm__ volatile("" : "+r"(x));
    }
    sink = x;
}

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

int main(int argc, char **argv) {
    int depth = argc > 1 ? atoi(argv[1]) : 300;
    alarm(argc > 2 ? atoi(argv[2]) : 30);
    descend(depth);
    return 0;
}
