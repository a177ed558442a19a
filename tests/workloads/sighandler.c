/* A hot signal handler: SIGPROF every millisecond of CPU time, and the handler spends about
 * half the time in handler_work. Built without frame pointers, a walk from handler_work must
 * cross the signal frame (__restore_rt, whose unwind rule is the ucontext on the stack) back
 * into the interrupted loop and main.
 * Usage: sighandler [seconds] */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void handler_work(void) {
    for (unsigned long i = 0; i < 400000; i++) sink += i ^ (i >> 3);
}

__attribute__((noinline)) void on_signal(int sig) {
    (void)sig;
    handler_work();
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
    struct itimerval every_ms = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_PROF, &every_ms, NULL);
    interrupted_loop();
    return 0;
}
