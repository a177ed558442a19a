/* Spending time, not a count of iterations, for the workloads that promise a share of time.
 *
 * A fixed count of loop iterations takes whatever time the CPU makes of it: a count sized for
 * one machine is a few percent of the time on a faster one, and every share a test derives
 * from it moves. So a workload that must spend a share of its time in a function asks for a
 * length of CPU time instead, and a pace turns it into a count:
 *
 *   static struct pace leaf_pace;
 *   PACED(&leaf_pace, 6000000, leaf(count));   // leaf(count) runs for about 6 ms of CPU
 *
 * The call is timed by the thread's CPU clock (CLOCK_THREAD_CPUTIME_ID: time this thread ran,
 * whatever else shares its CPU), read around the call and never inside it, so no sample of the
 * function lands in the clock's system call and the function's frames stay as they were. The
 * next count follows the rate measured so far, and carries the time still owed or overspent,
 * so that over many calls the time spent is the time asked, on any CPU and beside any
 * neighbour. The first call of a pace that has not learnt its rate runs a short calibration.
 */
#ifndef SCORCH_PACE_H
#define SCORCH_PACE_H

#include <time.h>

static inline long long thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

struct pace {
    /* Iterations per nanosecond of CPU time, as measured; 0 until the first call. */
    double per_ns;
    /* Time asked minus time spent over the calls so far, in nanoseconds. */
    long long owed_ns;
};

/* The count to run for `ns` of CPU time, with what is owed: between none (far ahead) and
 * twice the time asked (far behind), so that a slow call is made up over several. */
static inline unsigned long pace_count(const struct pace *pace, long long ns) {
    long long want = ns + pace->owed_ns;
    if (want < 0)
        want = 0;
    if (want > 2 * ns)
        want = 2 * ns;
    double count = (double)want * pace->per_ns;
    return count < 1.0 ? 1 : (unsigned long)count;
}

/* Learns from one call: `count` iterations took `spent_ns` where `asked_ns` was asked. The
 * rate is a moving average, which follows a CPU that changes speed over a few calls. What is
 * owed is bounded, so a stall (a long preemption is not CPU time, but a page fault is) is not
 * made up forever after. */
static inline void pace_spent(struct pace *pace, unsigned long count, long long asked_ns,
                              long long spent_ns) {
    pace->owed_ns += asked_ns - spent_ns;
    if (pace->owed_ns > 4 * asked_ns)
        pace->owed_ns = 4 * asked_ns;
    if (pace->owed_ns < -4 * asked_ns)
        pace->owed_ns = -4 * asked_ns;
    if (spent_ns <= 0)
        return;
    double rate = (double)count / (double)spent_ns;
    pace->per_ns = pace->per_ns > 0.0 ? 0.75 * pace->per_ns + 0.25 * rate : rate;
}

/* Runs CALL, an expression that uses the variable `count`, for about ASKED_NS of this thread's
 * CPU time. A pace that has not learnt its rate first times CALL on a count of 10,000 (a few
 * microseconds to a millisecond on the loops here), then on counts growing until a call takes a
 * tenth of a millisecond, long enough for the clock's resolution and call cost to vanish. */
#define PACED(PACE, ASKED_NS, CALL)                                                            \
    do {                                                                                       \
        struct pace *pace_ = (PACE);                                                           \
        long long asked_ = (ASKED_NS);                                                         \
        unsigned long count;                                                                   \
        if (pace_->per_ns <= 0.0) {                                                            \
            for (count = 10000;; count *= 4) {                                                 \
                long long start_ = thread_cpu_ns();                                            \
                CALL;                                                                          \
                long long spent_ = thread_cpu_ns() - start_;                                   \
                if (spent_ >= 100000 || count > (1UL << 40)) {                                 \
                    pace_->per_ns = (double)count / (double)(spent_ > 0 ? spent_ : 1);         \
                    break;                                                                     \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        count = pace_count(pace_, asked_);                                                     \
        long long start_ = thread_cpu_ns();                                                    \
        CALL;                                                                                  \
        pace_spent(pace_, count, asked_, thread_cpu_ns() - start_);                            \
    } while (0)

/* xorshift64: a cheap random factor between 0.5 and 1.5 for a call's length, drawn from
 * `state` (seeded by the caller; never 0). Calls of one fixed length make a fixed cycle, and a
 * cycle near a multiple of a profiler's sampling period aliases with it: the samples keep
 * landing at the same points of the cycle and the shares they show drift off. */
static inline double pace_jitter(unsigned long *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return 0.5 + (double)(*state % 1000) / 1000.0;
}

#endif
