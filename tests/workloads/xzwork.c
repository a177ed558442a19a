/* Compresses a buffer over and over with Debian's liblzma (built without frame pointers), so
 * most CPU time is deep inside the library:
 *
 *   main -> compress_forever -> lzma_easy_buffer_encode (liblzma) -> ...
 *
 * Usage: xzwork [seconds]; exits by itself (SIGALRM). Link with -llzma.
 */
#include <lzma.h>
#include <stdlib.h>
#include <unistd.h>

#define SIZE (1 << 20)

volatile size_t sink;

__attribute__((noinline)) static void compress_forever(unsigned char *input, unsigned char *output) {
    for (unsigned round = 0;; round++) {
        /* Compressible but not trivial: a slowly drifting pseudo-random text. */
        unsigned long x = round;
        for (size_t i = 0; i < SIZE; i++) {
            x = x * 6364136223846793005UL + 1442695040888963407UL;
            input[i] = "abcdefghij"[(x >> 33) % 10];
        }
        size_t written = 0;
        if (lzma_easy_buffer_encode(6, LZMA_CHECK_CRC64, NULL, input, SIZE, output, &written,
                                    2 * SIZE) != LZMA_OK)
            abort();
        sink = written;
    }
}

int main(int argc, char **argv) {
    alarm(argc > 1 ? atoi(argv[1]) : 30);
    compress_forever(malloc(SIZE), malloc(2 * SIZE));
    return 0;
}
