/* Unloads a library and loads another of the same size, which the kernel maps at the same
 * address:
 *
 *   main -> run_library -> swap_spin_a (libswap_a.so, FIRST s) ; dlclose ;
 *   main -> run_library -> swap_spin_b (libswap_b.so, at the address libswap_a.so had)
 *
 * The two are built from swaplib.c with different frame sizes, so an unwinder that keeps
 * libswap_a.so's table for the address walks libswap_b.so's frames with the wrong CFA offset.
 * Usage: relinker LIB_A LIB_B ADDRESSES_FILE [seconds [FIRST]]; writes both load addresses to
 * ADDRESSES_FILE (the test needs them equal) and exits by itself (SIGALRM) after `seconds`
 * (30); runs LIB_A for FIRST seconds (3).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Calls the library's spin until `seconds` have passed (forever when negative). */
__attribute__((noinline)) static void run_library(void (*spin)(unsigned long), double seconds) {
    double end = now() + seconds;
    while (seconds < 0 || now() < end) {
        spin(1000000);
        __asm__ volatile("" ::: "memory");
    }
}

static void *load(const char *path, const char *symbol, void (**spin)(unsigned long),
                  unsigned long *base) {
    void *library = dlopen(path, RTLD_NOW);
    if (!library)
        exit(1);
    *spin = (void (*)(unsigned long))dlsym(library, symbol);
    struct link_map *map = NULL;
    if (!*spin || dlinfo(library, RTLD_DI_LINKMAP, &map) != 0)
        exit(1);
    *base = map->l_addr;
    return library;
}

int main(int argc, char **argv) {
    if (argc < 4)
        return 2;
    alarm(argc > 4 ? atoi(argv[4]) : 30);
    void (*spin)(unsigned long);
    unsigned long a, b;
    void *library = load(argv[1], "swap_spin_a", &spin, &a);
    run_library(spin, argc > 5 ? atof(argv[5]) : 3.0);
    if (dlclose(library) != 0)
        return 1;
    load(argv[2], "swap_spin_b", &spin, &b);
    FILE *out = fopen(argv[3], "w");
    if (!out)
        return 1;
    fprintf(out, "%lx %lx\n", a, b);
    fclose(out);
    run_library(spin, -1);
    return 0;
}
