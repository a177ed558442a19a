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
// Usage: gotree [seconds]. It exits by itself, so a failed test never leaves it spinning.
package main

import (
	"os"
	"strconv"
	"time"
)

var sink uint64

// The loop count of one unit of work: a few milliseconds.
const unit = 2000000

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

//go:noinline
func parse() { sink += spin(unit) }

//go:noinline
func matmul() { sink += spin(unit) }

//go:noinline
func reduce() { sink += spin(unit) }

//go:noinline
func digest() { sink += checksum(unit) }

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
	seconds := 30
	if len(os.Args) > 1 {
		if n, err := strconv.Atoi(os.Args[1]); err == nil {
			seconds = n
		}
	}
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	for time.Now().Before(deadline) {
		run()
	}
}
