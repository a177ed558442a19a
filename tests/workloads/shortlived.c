/* A process that spins for a given number of milliseconds and then exits normally, so a
 * recording outlives it: its frames must still be named from what was captured while it ran.
 * Usage: shortlived [milliseconds]. SIGALRM is a backstop should the clock loop misbehave.
 */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void short_spin(unsigned long n) {
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

/* Checks the clock every ~1 ms of work, so nearly all the time is in short_spin. */
__attribute__((noinline)) void short_run(double seconds) {
    double end = now() + seconds;
    while (now() < end)
        short_spin(300000UL);
}

int main(int argc, char **argv) {
    int ms = argc > 1 ? atoi(argv[1]) : 1500;
    alarm(ms / 1000 + 5);
    short_run(ms / 1000.0);
    return 0;
}
