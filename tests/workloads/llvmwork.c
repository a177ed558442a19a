/* The largest binary of `cargo xtask bench --only scale`: a process that loads libLLVM (the
 * nightly Rust toolchain's, about 190 MB) with dlopen and works inside it, so its samples
 * need that library's unwind table:
 *
 *   main -> doze -> wake -> compile_round -> LLVMRunPasses (libLLVM) -> ... the O2 pipeline
 *
 *   llvmwork LIBLLVM PERIOD_MS WORK_US SECONDS [BURST_MS]
 *
 * Each round builds a small function through LLVM's C API (a chain of adds and multiplies
 * over its arguments), verifies it, runs the O2 pipeline over it and prints it. As dozer.c:
 * sleeps of PERIOD_MS times 0.5 to 1.5, WORK_US of CPU time a wake, BURST_MS of work first
 * (under SCHED_FIFO when allowed), and an exit after SECONDS. Built -O2 -fomit-frame-pointer.
 */
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* LLVM's C API types are opaque pointers. */
typedef void *Ref;

static struct {
    Ref (*context_create)(void);
    void (*context_dispose)(Ref);
    Ref (*module_create)(const char *, Ref);
    void (*module_dispose)(Ref);
    Ref (*int64_type)(Ref);
    Ref (*function_type)(Ref, Ref *, unsigned, int);
    Ref (*add_function)(Ref, const char *, Ref);
    Ref (*append_block)(Ref, Ref, const char *);
    Ref (*builder_create)(Ref);
    void (*builder_position)(Ref, Ref);
    void (*builder_dispose)(Ref);
    Ref (*get_param)(Ref, unsigned);
    Ref (*build_add)(Ref, Ref, Ref, const char *);
    Ref (*build_mul)(Ref, Ref, Ref, const char *);
    Ref (*build_ret)(Ref, Ref);
    int (*verify_module)(Ref, int, char **);
    char *(*print_module)(Ref);
    void (*dispose_message)(char *);
    Ref (*pass_options_create)(void);
    void (*pass_options_dispose)(Ref);
    Ref (*run_passes)(Ref, const char *, Ref, Ref);
    void (*consume_error)(Ref);
} llvm;

static volatile unsigned long sink;

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void *need(void *library, const char *name) {
    void *symbol = dlsym(library, name);
    if (!symbol) {
        fprintf(stderr, "llvmwork: no %s in the library\n", name);
        exit(1);
    }
    return symbol;
}

__attribute__((noinline)) static void compile_round(unsigned long seed) {
    Ref context = llvm.context_create();
    Ref module = llvm.module_create("scale", context);
    Ref i64 = llvm.int64_type(context);
    Ref params[3] = {i64, i64, i64};
    Ref function = llvm.add_function(module, "mix", llvm.function_type(i64, params, 3, 0));
    Ref builder = llvm.builder_create(context);
    llvm.builder_position(builder, llvm.append_block(context, function, "entry"));
    Ref value = llvm.get_param(function, 0);
    for (unsigned i = 0; i < 48; i++) {
        Ref other = llvm.get_param(function, (unsigned)((seed + i) % 3));
        value = (i + seed) % 2 ? llvm.build_add(builder, value, other, "")
                               : llvm.build_mul(builder, value, other, "");
    }
    llvm.build_ret(builder, value);
    llvm.builder_dispose(builder);
    char *message = NULL;
    /* LLVMReturnStatusAction */
    llvm.verify_module(module, 2, &message);
    llvm.dispose_message(message);
    Ref options = llvm.pass_options_create();
    Ref error = llvm.run_passes(module, "default<O2>", NULL, options);
    if (error)
        llvm.consume_error(error);
    llvm.pass_options_dispose(options);
    char *text = llvm.print_module(module);
    sink += text[0];
    llvm.dispose_message(text);
    llvm.module_dispose(module);
    llvm.context_dispose(context);
}

/* Compiles rounds until `ms` of CPU time have passed. */
__attribute__((noinline)) static void wake(double ms, unsigned long *seed) {
    double end = cpu_ms() + ms;
    do {
        compile_round((*seed)++);
    } while (cpu_ms() < end);
}

/* `ms` of work alone on a CPU: SCHED_FIFO (when allowed), then back to SCHED_OTHER. */
__attribute__((noinline)) static void burst(double ms) {
    unsigned long seed = 1;
    struct sched_param fifo = {.sched_priority = 1}, other = {.sched_priority = 0};
    int raised = sched_setscheduler(0, SCHED_FIFO, &fifo) == 0;
    wake(ms, &seed);
    if (raised)
        sched_setscheduler(0, SCHED_OTHER, &other);
}

__attribute__((noinline)) static void doze(long period_ms, double work_ms) {
    unsigned long seed = (unsigned long)getpid();
    for (;;) {
        long ms = period_ms / 2 + rand() % (period_ms + 1);
        struct timespec nap = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&nap, NULL);
        wake(work_ms, &seed);
    }
}

int main(int argc, char **argv) {
    if (argc < 5)
        return 2;
    long period_ms = atol(argv[2]);
    double work_ms = atol(argv[3]) / 1e3;
    int seconds = atoi(argv[4]);
    double burst_ms = argc > 5 ? atol(argv[5]) : 60;
    if (period_ms < 1)
        return 2;
    alarm(seconds);
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        fprintf(stderr, "llvmwork: %s\n", dlerror());
        return 1;
    }
    llvm.context_create = need(library, "LLVMContextCreate");
    llvm.context_dispose = need(library, "LLVMContextDispose");
    llvm.module_create = need(library, "LLVMModuleCreateWithNameInContext");
    llvm.module_dispose = need(library, "LLVMDisposeModule");
    llvm.int64_type = need(library, "LLVMInt64TypeInContext");
    llvm.function_type = need(library, "LLVMFunctionType");
    llvm.add_function = need(library, "LLVMAddFunction");
    llvm.append_block = need(library, "LLVMAppendBasicBlockInContext");
    llvm.builder_create = need(library, "LLVMCreateBuilderInContext");
    llvm.builder_position = need(library, "LLVMPositionBuilderAtEnd");
    llvm.builder_dispose = need(library, "LLVMDisposeBuilder");
    llvm.get_param = need(library, "LLVMGetParam");
    llvm.build_add = need(library, "LLVMBuildAdd");
    llvm.build_mul = need(library, "LLVMBuildMul");
    llvm.build_ret = need(library, "LLVMBuildRet");
    llvm.verify_module = need(library, "LLVMVerifyModule");
    llvm.print_module = need(library, "LLVMPrintModuleToString");
    llvm.dispose_message = need(library, "LLVMDisposeMessage");
    llvm.pass_options_create = need(library, "LLVMCreatePassBuilderOptions");
    llvm.pass_options_dispose = need(library, "LLVMDisposePassBuilderOptions");
    llvm.run_passes = need(library, "LLVMRunPasses");
    llvm.consume_error = need(library, "LLVMConsumeError");
    srand((unsigned)getpid());
    burst(burst_ms);
    doze(period_ms, work_ms);
    return 0;
}
