/* Spends its time in libwork.so's `libwork_spin`, called from this executable's
 * `uselib_caller`. Linked by the tests against libwork.so with an rpath.
 * Usage: uselib [seconds]. Exits by itself after `seconds` (SIGALRM).
 */
#include <stdlib.h>
#include <unistd.h>

void libwork_spin(unsigned long n);

__attribute__((noinline)) void uselib_caller(unsigned long n) {
    for (;;) {
        libwork_spin(n);
        __asm__ volatile("");
    }
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 30;
    alarm(seconds);
    uselib_caller(argc > 2 ? strtoul(argv[2], NULL, 10) : 1000000UL);
    return 0;
}
