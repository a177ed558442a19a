/* Hand-written assembly with no CFI that keeps a frame pointer, called from C built without
 * frame pointers (as in codecs, crypto and runtimes' generated code). The unwind table of this
 * binary describes main, run and spin_caller, but has no row for asm_spin: the walk must take a
 * frame-pointer step out of it, then go back to the table for its callers.
 * Usage: nocfi [seconds]. */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

unsigned long asm_spin(unsigned long n);

/* No .cfi_* directives: the assembler writes no FDE for it. */
__asm__(".text\n"
        ".globl asm_spin\n"
        ".type asm_spin, @function\n"
        "asm_spin:\n"
        "    push %rbp\n"
        "    mov %rsp, %rbp\n"
        "    mov %rdi, %rcx\n"
        "    xor %eax, %eax\n"
        "1:  lea 1(%rax,%rax,2), %rax\n"
        "    dec %rcx\n"
        "    jnz 1b\n"
        "    pop %rbp\n"
        "    ret\n"
        ".size asm_spin, .-asm_spin\n");

volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Not a tail call: the result is used after asm_spin returns. */
__attribute__((noinline)) unsigned long spin_caller(unsigned long n) {
    unsigned long x = asm_spin(n);
    __asm__ volatile("" : "+r"(x));
    return x + 1;
}

/* Each call's length drawn at random between 500,000 and 1,500,000 rounds (about a
 * millisecond on average): calls of one fixed length alias with the 999 Hz sampling period,
 * and a run's samples then drift slowly through asm_spin's epilogue, where after `pop %rbp`
 * no frame pointer leads to its caller (a CI run had one sample in 796 on its `ret`). */
__attribute__((noinline)) void run(double seconds) {
    double end = now() + seconds;
    unsigned long state = 0x9e3779b97f4a7c15UL;
    while (now() < end) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        sink += spin_caller(500000UL + state % 1000000UL);
    }
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 30;
    alarm(seconds + 5);
    run(seconds);
    return 0;
}
