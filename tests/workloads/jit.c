/* A "JIT": copies a tiny machine-code loop into an anonymous executable page, announces it in
 * /tmp/perf-<pid>.map the way JIT runtimes do for perf (`<start> <size> <name>`, hex without
 * 0x), and spends its time calling it. Only the map can name those frames.
 *
 * The generated function builds a frame-pointer frame, so unwinding continues through it to
 * `call_jit` and `main`.
 * Usage: jit [seconds] [iterations] [map]. Exits by itself after `seconds` (SIGALRM); the test
 * removes the map. `map` is what the process puts at the map's path before it runs the code:
 * `write` (the default) the map itself; or, as a hostile process would, `fifo` (a FIFO: an
 * open or read that never returns), `link:TARGET` (a symlink to TARGET: /dev/zero, a host
 * file), or `none`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* unsigned long jit_hot_loop(unsigned long n): counts n down to zero. */
#if defined(__x86_64__)
static const unsigned char code[] = {
    0x55,             /* push %rbp                 */
    0x48, 0x89, 0xe5, /* mov  %rsp,%rbp            */
    0x48, 0x89, 0xf8, /* mov  %rdi,%rax            */
    0x48, 0xff, 0xc8, /* 1: dec %rax               */
    0x75, 0xfb,       /* jnz  1b                   */
    0x5d,             /* pop  %rbp                 */
    0xc3,             /* ret                       */
};
#elif defined(__aarch64__)
static const unsigned char code[] = {
    0xfd, 0x7b, 0xbf, 0xa9, /* stp x29, x30, [sp, #-16]! */
    0xfd, 0x03, 0x00, 0x91, /* mov x29, sp               */
    0x00, 0x04, 0x00, 0xf1, /* 1: subs x0, x0, #1        */
    0xe1, 0xff, 0xff, 0x54, /* b.ne 1b                   */
    0xfd, 0x7b, 0xc1, 0xa8, /* ldp x29, x30, [sp], #16   */
    0xc0, 0x03, 0x5f, 0xd6, /* ret                       */
};
#else
#error "jit.c has machine code for x86_64 and aarch64 only"
#endif

typedef unsigned long (*jit_fn)(unsigned long);

volatile unsigned long sink;

__attribute__((noinline)) void call_jit(jit_fn fn, unsigned long n) {
    for (;;) {
        sink = fn(n);
        __asm__ volatile("");
    }
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 30;
    alarm(seconds);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *mem = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memcpy(mem, code, sizeof code);
    __builtin___clear_cache((char *)mem, (char *)mem + sizeof code);
    /* Write, then execute: W^X, as hardened kernels and real JITs want. */
    if (mprotect(mem, page, PROT_READ | PROT_EXEC) != 0) {
        perror("mprotect");
        return 1;
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
    const char *how = argc > 3 ? argv[3] : "write";
    if (strcmp(how, "fifo") == 0) {
        if (mkfifo(path, 0644) != 0) {
            perror(path);
            return 1;
        }
    } else if (strncmp(how, "link:", 5) == 0) {
        if (symlink(how + 5, path) != 0) {
            perror(path);
            return 1;
        }
    } else if (strcmp(how, "write") == 0) {
        FILE *map = fopen(path, "w");
        if (!map) {
            perror(path);
            return 1;
        }
        fprintf(map, "%lx %zx jit_hot_loop\n", (unsigned long)mem, sizeof code);
        if (fclose(map) != 0) {
            perror(path);
            return 1;
        }
    } else if (strcmp(how, "none") != 0) {
        fprintf(stderr, "jit: unknown map kind %s\n", how);
        return 2;
    }
    call_jit((jit_fn)(void *)mem, argc > 2 ? strtoul(argv[2], NULL, 10) : 1000000UL);
    return 0;
}
