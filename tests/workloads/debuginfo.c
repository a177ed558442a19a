/* A workload the tests strip of every symbol and keep the DWARF of in a separate file (next to
 * it through .gnu_debuglink, or under /usr/lib/debug/.build-id/), so its names and lines can
 * only come from that file.
 *
 * The test finds the marked line (LOOP_LINE) in this file, so lines may move.
 * Usage: debuginfo [seconds]. Exits by itself after `seconds` (SIGALRM).
 */
#include <stdlib.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void debug_only_spin(unsigned long n) {
    /* Forces a frame: GCC 12 drops it in leaf functions even with
     * -mno-omit-leaf-frame-pointer, and an unwinder then skips the leaf's caller. */
    __asm__ volatile("" : : "r"(__builtin_frame_address(0)));
    unsigned long x = 1;
    for (unsigned long i = 0; i < n; i++) { x = x * 6364136223846793005UL + i; __asm__ volatile("" : "+r"(x)); } /* LOOP_LINE */
    sink = x;
}

__attribute__((noinline)) void debug_only_caller(unsigned long n) {
    for (;;) {
        debug_only_spin(n);
        __asm__ volatile("");
    }
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 30;
    alarm(seconds);
    debug_only_caller(argc > 2 ? strtoul(argv[2], NULL, 10) : 1000000UL);
    return 0;
}
