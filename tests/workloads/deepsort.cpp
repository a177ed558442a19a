// Deep stacks through libc and libstdc++ for the unwinder bench, built -O2
// -fomit-frame-pointer: main -> descend x DEPTH -> sort_round -> qsort (libc, its merge sort
// recursing about 12 deep) -> cmp, about 30 frames; each round also grows a std::string, so
// libstdc++ is mapped and unwound too.
// Usage: deepsort [seconds]. Exits by itself after `seconds` (SIGALRM).
#include <cstdlib>
#include <string>
#include <unistd.h>

static const int DEPTH = 10;
static const int N = 4096;
static volatile unsigned long sink;

extern "C" __attribute__((noinline)) int cmp(const void *a, const void *b) {
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
    for (int i = 0; i < 32; i++) {
        x = x * 6364136223846793005UL + 1;
        __asm__ volatile("" : "+r"(x));
    }
    sink = x;
    return (*(const unsigned long *)a > y) - (*(const unsigned long *)a < y);
}

__attribute__((noinline)) void sort_round(unsigned long *values, std::string &label) {
    static unsigned long round;
    for (int i = 0; i < N; i++)
        values[i] = (i * 2654435761UL + round) % 100003;
    round++;
    qsort(values, N, sizeof values[0], cmp);
    label += static_cast<char>('a' + round % 26);
    if (label.size() > 4096)
        label.clear();
}

__attribute__((noinline)) void descend(int depth, unsigned long *values, std::string &label) {
    if (depth == 0) {
        for (;;)
            sort_round(values, label);
    }
    descend(depth - 1, values, label);
    // Keeps the recursive call from becoming a jump.
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
    alarm(argc > 1 ? atoi(argv[1]) : 30);
    static unsigned long values[N];
    std::string label;
    descend(DEPTH, values, label);
    return 0;
}
