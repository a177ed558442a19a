/* Two threads bounce a byte over a pair of pipes: two context switches per round trip, as
 * many as the machine can do, for measuring what a scheduler hook costs.
 *
 *   pingpong SECONDS
 *
 * prints "round_trips N switches_per_second S".
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int there[2], back[2];
static volatile int done;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static void *pong(void *arg) {
    (void)arg;
    char byte;
    while (read(there[0], &byte, 1) == 1) {
        if (byte == 'q' || write(back[1], &byte, 1) != 1) {
            break;
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    if (pipe(there) != 0 || pipe(back) != 0) {
        return 1;
    }
    pthread_t thread;
    pthread_create(&thread, NULL, pong, NULL);
    long long trips = 0;
    char byte = 'x';
    double start = now();
    double end = start + seconds;
    while ((trips & 1023) != 0 || now() < end) {
        if (write(there[1], &byte, 1) != 1 || read(back[0], &byte, 1) != 1) {
            return 1;
        }
        trips++;
    }
    double elapsed = now() - start;
    byte = 'q';
    if (write(there[1], &byte, 1) != 1) {
        return 1;
    }
    pthread_join(thread, NULL);
    printf("round_trips %lld switches_per_second %.0f\n", trips, 2 * trips / elapsed);
    return 0;
}
