// A C++ workload whose hot functions have mangled names: a method of a class in a namespace
// and a method of a class template instantiated for `unsigned long`. scorch must show them
// demangled: `scorch_cpp::Spinner::spin(unsigned long)` and
// `scorch_cpp::Accumulator<unsigned long>::run(unsigned long)`.
// Half the time in each, paced by the thread's CPU clock (pace.h), so on any CPU.
// Usage: cppwork [seconds [microseconds]]: each call asks for `microseconds` of CPU time
// (1,000 by default) times a random factor between 0.5 and 1.5. Exits by itself after
// `seconds` (SIGALRM).
#include <cstdlib>
#include <unistd.h>

#include "pace.h"

volatile unsigned long sink;

namespace scorch_cpp {

class Spinner {
public:
    // noinline and noclone: a clone would carry a `.constprop`-style suffix in its name.
    __attribute__((noinline, noclone)) unsigned long spin(unsigned long n) {
        // Forces a frame: GCC 12 drops it in leaf functions even with
        // -mno-omit-leaf-frame-pointer, and an unwinder then skips the leaf's caller.
        __asm__ volatile("" : : "r"(__builtin_frame_address(0)));
        unsigned long x = state_;
        for (unsigned long i = 0; i < n; i++) {
            x = x * 6364136223846793005UL + i;
            __asm__ volatile("" : "+r"(x));
        }
        state_ = x;
        return x;
    }

private:
    unsigned long state_ = 1;
};

template <typename T>
class Accumulator {
public:
    __attribute__((noinline, noclone)) T run(T n) {
        __asm__ volatile("" : : "r"(__builtin_frame_address(0)));
        T x = total_;
        for (T i = 0; i < n; i++) {
            x = x * 2862933555777941757UL + i;
            __asm__ volatile("" : "+r"(x));
        }
        total_ = x;
        return x;
    }

private:
    T total_ = 3;
};

// Half the time in each: both names must show up.
__attribute__((noinline, noclone)) void drive(unsigned long microseconds) {
    Spinner spinner;
    Accumulator<unsigned long> accumulator;
    struct pace spin_pace = {0.0, 0}, run_pace = {0.0, 0};
    unsigned long state = 0x9e3779b97f4a7c15UL;
    for (;;) {
        long long asked = (long long)(microseconds * 1000.0 * pace_jitter(&state));
        PACED(&spin_pace, asked, sink = spinner.spin(count));
        PACED(&run_pace, asked, sink = accumulator.run(count));
    }
}

}  // namespace scorch_cpp

int main(int argc, char **argv) {
    int seconds = argc > 1 ? std::atoi(argv[1]) : 30;
    alarm(seconds);
    scorch_cpp::drive(argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 1000UL);
    return 0;
}
