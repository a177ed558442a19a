/* Many small processes that each wake ten times a second to spin briefly: a host with more
 * processes than the unwinder's process map first holds.
 *
 *   napper CHILDREN DELAY_MS SECONDS
 *
 * waits DELAY_MS (so a profiler started with it sizes its maps before they exist), then forks
 * CHILDREN processes; each runs main -> child_main -> nap_spin about 100 us every 100 ms, for
 * SECONDS. Built without frame pointers.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) void nap_spin(void) {
    for (unsigned long i = 0; i < 40000; i++) {
        sink += i * i;
    }
    __asm__ volatile("");
}

__attribute__((noinline)) void child_main(void) {
    struct timespec nap = {0, 100 * 1000 * 1000};
    for (;;) {
        nap_spin();
        nanosleep(&nap, NULL);
    }
}

int main(int argc, char **argv) {
    int children = argc > 1 ? atoi(argv[1]) : 700;
    int delay_ms = argc > 2 ? atoi(argv[2]) : 0;
    int seconds = argc > 3 ? atoi(argv[3]) : 10;
    struct timespec delay = {delay_ms / 1000, (delay_ms % 1000) * 1000L * 1000L};
    nanosleep(&delay, NULL);
    for (int i = 0; i < children; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(seconds);
            child_main();
        }
    }
    alarm(seconds + 1);
    while (wait(NULL) > 0) {
    }
    return 0;
}
