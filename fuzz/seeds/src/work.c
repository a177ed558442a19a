/* Tiny freestanding program for fuzz seeds: a call chain with an inlined helper. */
static inline __attribute__((always_inline)) unsigned mix(unsigned x) { return x * 2654435761u ^ (x >> 13); }
__attribute__((noinline)) unsigned leaf(unsigned n) { unsigned h = 0; for (unsigned i = 0; i < n; i++) h = mix(h + i); return h; }
__attribute__((noinline)) unsigned middle(unsigned n) { return leaf(n) + leaf(n / 2); }
void _start(void) {
    unsigned r = middle(1000);
    __asm__ volatile("mov $60, %%eax; syscall" :: "D"(r & 1) : "rax", "rcx", "r11", "memory");
    __builtin_unreachable();
}
