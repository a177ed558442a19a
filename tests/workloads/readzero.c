/* A kernel-heavy workload: reads /dev/zero as fast as it can, so nearly every sample is in
 * the kernel's read path (ksys_read -> vfs_read -> read_iter_zero -> clearing user memory).
 * Usage: readzero [seconds]. Exits by itself after `seconds`.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

static char buffer[1 << 20];

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 30;
    alarm(seconds);
    int fd = open("/dev/zero", O_RDONLY);
    if (fd < 0)
        return 1;
    for (;;) {
        if (read(fd, buffer, sizeof buffer) < 0)
            return 1;
    }
}
