/* Spins in SPIN, called from CALLER: names given at build time (-DSPIN=... -DCALLER=...), so
 * the tests can build binaries whose machine code is the same byte for byte and whose symbols
 * name it differently. The build id poisoning test runs two such twins under one build id; the
 * debug link test hides the symbols of a twin with a secret name in a file the other's debug
 * link points at.
 * Usage: twin [seconds]. Exits by itself after `seconds` (SIGALRM).
 */
#include <stdlib.h>
#include <unistd.h>

#ifndef SPIN
#define SPIN twin_spin
#endif
#ifndef CALLER
#define CALLER twin_caller
#endif

volatile unsigned long sink;

__attribute__((noinline)) void SPIN(unsigned long n) {
    /* Forces a frame: GCC 12 drops it in leaf functions even with
     * -mno-omit-leaf-frame-pointer, and an unwinder then skips the leaf's caller. */
    __asm__ volatile("" : : "r"(__builtin_frame_address(0)));
    unsigned long x = 1;
    for (unsigned long i = 0; i < n; i++) {
        x = x * 6364136223846793005UL + i;
        __asm__ volatile("" : "+r"(x));
    }
    sink = x;
}

__attribute__((noinline)) void CALLER(unsigned long n) {
    for (;;) {
        SPIN(n);
        __asm__ volatile("");
    }
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 30;
    alarm(seconds);
    CALLER(1000000UL);
    return 0;
}
