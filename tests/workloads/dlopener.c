/* Loads a library with dlopen 2 s after it starts, then spends its time in it:
 *
 *   main -> spin_before (2 s) ; main -> call_library -> libwork_spin (libwork.so, dlopen'd)
 *
 * The unwinder meets the library's pcs in a mapping it has not seen: its tables must be
 * loaded within a window. Usage: dlopener LIBRARY [seconds]; exits by itself (SIGALRM).
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) static void spin_before(double seconds) {
    double end = now() + seconds;
    unsigned long x = 1;
    while (now() < end)
        for (int i = 0; i < 100000; i++) {
            x = x * 6364136223846793005UL + i;
            __asm__ volatile("" : "+r"(x));
        }
    sink = x;
}

__attribute__((noinline)) static void call_library(void (*spin)(unsigned long)) {
    for (;;) {
        spin(10000000);
        __asm__ volatile("" ::: "memory");
    }
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    alarm(argc > 2 ? atoi(argv[2]) : 30);
    spin_before(2.0);
    void *library = dlopen(argv[1], RTLD_NOW);
    if (!library)
        return 1;
    void (*spin)(unsigned long) = (void (*)(unsigned long))dlsym(library, "libwork_spin");
    if (!spin)
        return 1;
    call_library(spin);
    return 0;
}
