/* A hot signal handler: SIGPROF every millisecond of CPU time, and the handler spends about
 * half the time in handler_work. Built without frame pointers, a walk from handler_work must
 * cross the signal frame (__restore_rt, whose unwind rule is the ucontext on the stack) back
 * into the interrupted loop and main.
 *
 * Half, whatever the CPU and the kernel: each signal asks handler_work for as much CPU time
 * as the loop had since the handler last returned (times a random factor between 0.5 and 1.5,
 * against aliasing with a profiler's period), paced by the thread's CPU clock (pace.h). The
 * timer's real period depends on the kernel (CPU timers are checked at the scheduler's tick),
 * a fixed time would not be half of it, and a fixed count would take whatever time the CPU
 * makes of it.
 * Usage: sighandler [seconds] */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "pace.h"

volatile unsigned long sink;

static struct pace handler_pace;
/* The thread's CPU time when the handler last returned, and the jitter's state. */
static long long returned_ns;
static unsigned long jitter_state = 0x9e3779b97f4a7c15UL;

__attribute__((noinline)) void handler_work(unsigned long count) {
    for (unsigned long i = 0; i < count; i++) sink += i ^ (i >> 3);
}

__attribute__((noinline)) void on_signal(int sig) {
    (void)sig;
    long long looped = thread_cpu_ns() - returned_ns;
    PACED(&handler_pace, (long long)(looped * pace_jitter(&jitter_state)), handler_work(count));
    returned_ns = thread_cpu_ns();
}

__attribute__((noinline)) void interrupted_loop(void) {
    for (;;) {
        for (unsigned long i = 0; i < 1000; i++) sink += i;
        __asm__ volatile("");
    }
}

int main(int argc, char **argv) {
    alarm(argc > 1 ? atoi(argv[1]) : 30);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGPROF, &action, NULL);
    returned_ns = thread_cpu_ns();
    struct itimerval every_ms = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_PROF, &every_ms, NULL);
    interrupted_loop();
    return 0;
}
