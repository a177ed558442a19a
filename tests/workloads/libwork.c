/* The shared library of the `uselib` workload: its hot function must be named from this
 * library's own symbols, and its frames attributed to the library's mapping.
 * Built by the tests with gcc -shared -fPIC.
 */
volatile unsigned long libwork_sink;

__attribute__((noinline)) void libwork_spin(unsigned long n) {
    /* Forces a frame: GCC 12 drops it in leaf functions even with
     * -mno-omit-leaf-frame-pointer, and an unwinder then skips the leaf's caller. */
    __asm__ volatile("" : : "r"(__builtin_frame_address(0)));
    unsigned long x = 1;
    for (unsigned long i = 0; i < n; i++) {
        x = x * 6364136223846793005UL + i;
        __asm__ volatile("" : "+r"(x));
    }
    libwork_sink = x;
}
