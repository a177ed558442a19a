/* Calls into libbigtable.so for the seconds given (argv[1]): the library's unwind table,
 * which the test generates, has about a million rows, as a compiler's libLLVM has, so the
 * daemon grows a row pool for it while this runs and can give it back once it exits. */
#include <stdlib.h>
#include <time.h>

void big_0(void);

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        for (int i = 0; i < 1000; i++) {
            big_0();
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return 0;
}
