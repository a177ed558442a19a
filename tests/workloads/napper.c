/* Many small processes that each wake ten times a second to spin briefly: a host with more
 * processes than the unwinder's process map first holds.
 *
 *   napper CHILDREN DELAY_MS SECONDS
 *
 * waits DELAY_MS (so a profiler started with it sizes its maps before they exist), then forks
 * CHILDREN processes; each runs main -> child_main -> nap_spin for 100 us of its CPU time
 * (pace.h: a time, not a count, so each child is the same load on any CPU) every 100 ms, for
 * SECONDS: 1 ms of CPU a second per child. Built without frame pointers. When the children
 * are gone it prints their CPU time, "children_cpu_ns N", for the tests to check that load.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pace.h"

#define SPIN_NS 100000LL

static volatile unsigned long sink;
/* Learnt by the parent before it forks, so each child starts with the rate. */
static struct pace spin_pace;

__attribute__((noinline)) void nap_spin(unsigned long count) {
    for (unsigned long i = 0; i < count; i++) {
        sink += i * i;
    }
    __asm__ volatile("");
}

__attribute__((noinline)) void child_main(void) {
    struct timespec nap = {0, 100 * 1000 * 1000};
    for (;;) {
        PACED(&spin_pace, SPIN_NS, nap_spin(count));
        nanosleep(&nap, NULL);
    }
}

int main(int argc, char **argv) {
    int children = argc > 1 ? atoi(argv[1]) : 700;
    int delay_ms = argc > 2 ? atoi(argv[2]) : 0;
    int seconds = argc > 3 ? atoi(argv[3]) : 10;
    struct timespec delay = {delay_ms / 1000, (delay_ms % 1000) * 1000L * 1000L};
    nanosleep(&delay, NULL);
    PACED(&spin_pace, SPIN_NS, nap_spin(count));
    spin_pace.owed_ns = 0;
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
    struct rusage children_usage;
    getrusage(RUSAGE_CHILDREN, &children_usage);
    printf("children_cpu_ns %lld\n",
           (children_usage.ru_utime.tv_sec + children_usage.ru_stime.tv_sec) * 1000000000LL +
               (children_usage.ru_utime.tv_usec + children_usage.ru_stime.tv_usec) * 1000LL);
    return 0;
}
