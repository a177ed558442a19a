/* The libraries of the `relinker` workload: built twice, with -DNAME=swap_spin_a
 * -DFRAME=4096 and -DNAME=swap_spin_b -DFRAME=16, so the same code sits at the same offsets
 * with different frame sizes (a different CFA offset in each one's unwind table).
 */
volatile unsigned long swap_sink;

__attribute__((noinline)) void NAME(unsigned long n) {
    volatile unsigned char frame[FRAME];
    frame[0] = 1;
    unsigned long x = frame[0];
    for (unsigned long i = 0; i < n; i++) {
        x = x * 6364136223846793005UL + i;
        __asm__ volatile("" : "+r"(x));
    }
    frame[FRAME - 1] = (unsigned char)x;
    swap_sink = x + frame[FRAME - 1];
}
