/* A process that claims to be a JVM and lies about it, for the HotSpot runtime's adversarial
 * test: it exports the eleven globals a libjvm exports for the serviceability agent
 * (gHotSpotVMStructs and the geometry of its entries, the same for gHotSpotVMTypes), built
 * with -rdynamic so they are dynamic symbols, and points them at what MODE says:
 *
 *   garbage   tables at an unmapped address
 *   stride    an entry stride of a terabyte
 *   endless   a million well-formed entries and no terminating one
 *   longname  entries whose names run for 16 MiB without a NUL
 *   selfref   entries whose names are the table itself
 *
 * then spins in `fake_spin` for SECONDS: `fakejvm MODE SECONDS`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* One VMStructEntry as HotSpot lays it out on 64-bit builds. */
struct entry {
    const char *type_name;
    const char *field_name;
    const char *type_string;
    int32_t is_static;
    uint64_t offset;
    void *address;
};

void *gHotSpotVMStructs;
uint64_t gHotSpotVMStructEntryArrayStride = sizeof(struct entry);
uint64_t gHotSpotVMStructEntryTypeNameOffset = 0;
uint64_t gHotSpotVMStructEntryFieldNameOffset = 8;
uint64_t gHotSpotVMStructEntryIsStaticOffset = 24;
uint64_t gHotSpotVMStructEntryOffsetOffset = 32;
uint64_t gHotSpotVMStructEntryAddressOffset = 40;
void *gHotSpotVMTypes;
uint64_t gHotSpotVMTypeEntryArrayStride = 40;
uint64_t gHotSpotVMTypeEntryTypeNameOffset = 0;
uint64_t gHotSpotVMTypeEntrySizeOffset = 32;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) uint64_t fake_spin(uint64_t n) {
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++)
        total += i * i ^ (total >> 3);
    return total;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "garbage";
    double seconds = argc > 2 ? atof(argv[2]) : 10;
    size_t count = 1 << 20;
    struct entry *entries = NULL;
    if (strcmp(mode, "garbage") == 0) {
        gHotSpotVMStructs = (void *)0xdead0000000;
        gHotSpotVMTypes = (void *)0xdead1000000;
    } else if (strcmp(mode, "stride") == 0) {
        gHotSpotVMStructs = &gHotSpotVMStructs;
        gHotSpotVMTypes = &gHotSpotVMTypes;
        gHotSpotVMStructEntryArrayStride = 1ULL << 40;
        gHotSpotVMTypeEntryArrayStride = 1ULL << 40;
    } else if (strcmp(mode, "endless") == 0 || strcmp(mode, "longname") == 0 ||
               strcmp(mode, "selfref") == 0) {
        entries = mmap(NULL, count * sizeof(struct entry), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (entries == MAP_FAILED)
            return 1;
        const char *type = "CodeBlob", *field = "_name";
        if (strcmp(mode, "longname") == 0) {
            size_t size = 16 << 20;
            char *name = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                              -1, 0);
            if (name == MAP_FAILED)
                return 1;
            memset(name, 'A', size);
            type = field = name;
        } else if (strcmp(mode, "selfref") == 0) {
            type = field = (const char *)entries;
        }
        for (size_t i = 0; i < count; i++) {
            entries[i].type_name = type;
            entries[i].field_name = field;
            entries[i].offset = 8;
        }
        gHotSpotVMStructs = entries;
        gHotSpotVMTypes = entries;
    } else {
        fprintf(stderr, "fakejvm: unknown mode %s\n", mode);
        return 2;
    }
    uint64_t total = 0;
    double end = now() + seconds;
    while (now() < end)
        total += fake_spin(100000);
    printf("%llu\n", (unsigned long long)total);
    return 0;
}
