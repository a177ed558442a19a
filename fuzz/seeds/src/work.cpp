// Tiny freestanding C++ program for fuzz seeds: mangled names, a template, an inlined method.
namespace shapes {
struct Square { unsigned side; unsigned area() const { return side * side; } };
template <typename T> __attribute__((noinline)) unsigned total(const T *items, unsigned n) {
    unsigned sum = 0;
    for (unsigned i = 0; i < n; i++) sum += items[i].area();
    return sum;
}
}  // namespace shapes
extern "C" void _start() {
    shapes::Square squares[3] = {{1}, {2}, {3}};
    unsigned r = shapes::total(squares, 3);
    __asm__ volatile("mov $60, %%eax; syscall" :: "D"(r & 1) : "rax", "rcx", "r11", "memory");
    __builtin_unreachable();
}
