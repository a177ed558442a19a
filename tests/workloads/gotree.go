// A CPU-bound Go workload with a known call tree, built by the tests plainly, stripped
// (`-ldflags=-s -w`) and as a stripped PIE, the way container images ship Go:
//
//	main -> run -> parse   -> spin     1 unit  (12.5%)
//	            -> compute -> matmul -> spin   4 units (50%)
//	                       -> reduce -> spin   2 units (25%)
//	            -> digest  -> checksum         1 unit  (12.5%), checksum inlined into digest
//
// `spin` is a frameless leaf: it calls nothing and keeps everything in registers, so it never
// pushes a frame pointer, and a frame-pointer walk from it skips its caller. `checksum` is
// small enough for the compiler to inline: its samples are digest's machine code, which the
// inline tree names as checksum called from digest.
//
// Each unit is a length of CPU time, not a count of iterations, so the shares hold on any CPU:
// each caller times its call by the thread's CPU clock, from outside the callee (whose frames
// stay as they are), and the next call's count follows the rate measured so far, carrying the
// time still owed (as tests/workloads/pace.h does for the C workloads). A round's length is
// drawn at random between half and one and a half of the nominal one, the same for every
// unit of the round, so that no sampling period stays in step with it.
//
// Usage: gotree [seconds]. It exits by itself, so a failed test never leaves it spinning.
package main

import (
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

var sink uint64

// The CPU time of one unit of work, in nanoseconds, nominal, and this round's.
const unitNs = 2000000

var roundNs int64 = unitNs

// threadCPUNs is the CPU time this thread has run (CLOCK_THREAD_CPUTIME_ID, 3 on Linux); main
// locks its goroutine to its thread.
func threadCPUNs() int64 {
	var ts syscall.Timespec
	syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, 3, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

// pace turns a length of CPU time into a loop count for one caller.
type pace struct {
	perNs  float64 // iterations per nanosecond, as measured
	owedNs int64   // time asked minus time spent so far
}

// The rate main measures before the first round, every pace's first guess.
var firstPerNs float64

func (p *pace) count(askedNs int64) int {
	if p.perNs == 0 {
		p.perNs = firstPerNs
	}
	want := askedNs + p.owedNs
	if want < 0 {
		want = 0
	}
	if want > 2*askedNs {
		want = 2 * askedNs
	}
	if n := int(float64(want) * p.perNs); n > 1 {
		return n
	}
	return 1
}

func (p *pace) spent(n int, askedNs, spentNs int64) {
	p.owedNs += askedNs - spentNs
	if p.owedNs > 4*askedNs {
		p.owedNs = 4 * askedNs
	}
	if p.owedNs < -4*askedNs {
		p.owedNs = -4 * askedNs
	}
	if spentNs > 0 {
		p.perNs = 0.75*p.perNs + 0.25*float64(n)/float64(spentNs)
	}
}

//go:noinline
func spin(n int) uint64 {
	x := sink
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

// Inlined into digest (no noinline directive, and small enough).
func checksum(n int) uint64 {
	x := sink
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

var parsePace, matmulPace, reducePace, digestPace pace

//go:noinline
func parse() {
	n, start := parsePace.count(roundNs), threadCPUNs()
	sink += spin(n)
	parsePace.spent(n, roundNs, threadCPUNs()-start)
}

//go:noinline
func matmul() {
	n, start := matmulPace.count(roundNs), threadCPUNs()
	sink += spin(n)
	matmulPace.spent(n, roundNs, threadCPUNs()-start)
}

//go:noinline
func reduce() {
	n, start := reducePace.count(roundNs), threadCPUNs()
	sink += spin(n)
	reducePace.spent(n, roundNs, threadCPUNs()-start)
}

//go:noinline
func digest() {
	n, start := digestPace.count(roundNs), threadCPUNs()
	sink += checksum(n)
	digestPace.spent(n, roundNs, threadCPUNs()-start)
}

//go:noinline
func compute() {
	for i := 0; i < 4; i++ {
		matmul()
	}
	for i := 0; i < 2; i++ {
		reduce()
	}
}

//go:noinline
func run() {
	parse()
	compute()
	digest()
}

func main() {
	runtime.LockOSThread()
	seconds := 30
	if len(os.Args) > 1 {
		if n, err := strconv.Atoi(os.Args[1]); err == nil {
			seconds = n
		}
	}
	for n := 10000; ; n *= 4 {
		start := threadCPUNs()
		sink += spin(n)
		if spent := threadCPUNs() - start; spent >= 100000 || n > 1<<40 {
			firstPerNs = float64(n) / float64(spent)
			break
		}
	}
	state := uint64(0x9e3779b97f4a7c15) ^ uint64(os.Getpid())
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	for time.Now().Before(deadline) {
		// xorshift64: this round's factor on the unit, between 0.5 and 1.5.
		state ^= state << 13
		state ^= state >> 7
		state ^= state << 17
		roundNs = unitNs/2 + int64(state%unitNs)
		run()
	}
}
