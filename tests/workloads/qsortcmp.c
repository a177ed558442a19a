/* Sorts through libc's qsort with a deliberately slow comparator, so most CPU time is in
 * `cmp`, called from inside libc (built without frame pointers by Debian):
 *
 *   main -> sort_forever -> qsort (libc) -> ... -> cmp
 *
 * Usage: qsortcmp [seconds]. Exits by itself after `seconds` (SIGALRM).
 */
#include <stdlib.h>
#include <unistd.h>

#define N 4096

static volatile unsigned long sink;

__attribute__((noinline)) static int cmp(const void *a, const void *b) {
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
    /* Work inside the comparator, so it is the hot leaf. */
    for (int i = 0; i < 64; i++) {
        x = x * 6364136223846793005UL + 1;
        __asm__ volatile("" : "+r"(x));
    }
    sink = x;
    return (*(const unsigned long *)a > y) - (*(const unsigned long *)a < y);
}

__attribute__((noinline)) static void sort_forever(unsigned long *values) {
    for (unsigned long round = 0;; round++) {
        for (int i = 0; i < N; i++)
            values[i] = (i * 2654435761UL + round) % 100003;
        qsort(values, N, sizeof values[0], cmp);
    }
}

int main(int argc, char **argv) {
    alarm(argc > 1 ? atoi(argv[1]) : 30);
    static unsigned long values[N];
    sort_forever(values);
    return 0;
}
