// Source of go1.19-stripped, the seed beside it (Go 1.19.8, linux/amd64):
//   go build -trimpath -ldflags="-s -w" -o go1.19-stripped go1.19-stripped.go
package main

//go:noinline
func work(n int) int {
	s := 0
	for i := 0; i < n; i++ {
		s += i * i
	}
	return s
}

func main() {
	println(work(10))
}
