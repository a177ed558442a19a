// A light Go process of which `cargo xtask bench --only go` runs 20 distinct builds: each is
// linked with its own `-X main.variant=N`, which changes its data and so its Go build id, so
// the daemon sees 20 different binaries, as on a host running many Go services, not one binary
// 20 times.
//
// Every 50 ms it does a millisecond of work by the thread's CPU clock (a few percent of a CPU,
// on any CPU) in a small known call tree, so the profiler at 19 Hz catches it now and then
// without the 20 of them keeping the CPUs busy:
//
//	main -> work -> mix    (an integer hash loop seeded by the variant)
//	             -> render (formats the variant and the hash)
//	             -> tally  (sums the rendered bytes)
//
// Usage: govariant [seconds], 600 by default. It exits by itself, so a failed bench never
// leaves it running.
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// Set by the linker: `-ldflags=-X main.variant=N`.
var variant string

var sink uint64

// The CPU time mix spends each wake, and the loop count it checks the clock after: a few
// microseconds to a tenth of a millisecond, whatever the CPU.
const (
	mixNs     = 1000000
	mixRounds = 20000
)

// threadCPUNs is the CPU time this thread has run (CLOCK_THREAD_CPUTIME_ID, 3 on Linux); main
// locks its goroutine to its thread.
func threadCPUNs() int64 {
	var ts syscall.Timespec
	syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, 3, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

//go:noinline
func mix(seed uint64) uint64 {
	x := seed
	for end := threadCPUNs() + mixNs; threadCPUNs() < end; {
		x = mixRound(x)
	}
	return x
}

//go:noinline
func mixRound(seed uint64) uint64 {
	x := seed
	for i := 0; i < mixRounds; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}

//go:noinline
func render(x uint64) string {
	var b strings.Builder
	for i := 0; i < 16; i++ {
		fmt.Fprintf(&b, "variant %s round %d: %016x\n", variant, i, x+uint64(i))
	}
	return b.String()
}

//go:noinline
func tally(text string) uint64 {
	var sum uint64
	for i := 0; i < len(text); i++ {
		sum = sum*31 + uint64(text[i])
	}
	return sum
}

//go:noinline
func work(seed uint64) {
	x := mix(seed)
	sink += tally(render(x))
}

func main() {
	runtime.LockOSThread()
	seconds := 600
	if len(os.Args) > 1 {
		if n, err := strconv.Atoi(os.Args[1]); err == nil {
			seconds = n
		}
	}
	seed := uint64(len(variant)) + 1
	for _, c := range variant {
		seed = seed*131 + uint64(c)
	}
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	ticker := time.NewTicker(50 * time.Millisecond)
	defer ticker.Stop()
	for now := range ticker.C {
		if now.After(deadline) {
			break
		}
		work(seed + sink)
	}
	fmt.Printf("govariant %s: %x\n", variant, sink)
}
