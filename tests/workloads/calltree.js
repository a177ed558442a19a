// A JavaScript call tree for the unwinder: main -> middle -> {leafA, leafB}, run for the
// seconds given as the first argument. Run under `node --perf-basic-prof`, its JIT frames are
// named from /tmp/perf-PID.map; the builtins it calls (Math, Date.now) are code inside the
// node binary without CFI that keeps frame pointers.
"use strict";

function leafA(n) {
  let x = 0;
  for (let i = 0; i < n; i++) x = (Math.imul(x, 31) + i) | 0;
  return x;
}

function leafB(n) {
  let x = 1;
  for (let i = 0; i < n; i++) x = (x ^ Math.imul(i, 7)) | 0;
  return x;
}

function middle() {
  return leafA(200000) + leafB(100000);
}

function main(seconds) {
  const end = Date.now() + seconds * 1000;
  let sum = 0;
  while (Date.now() < end) sum = (sum + middle()) | 0;
  return sum;
}

main(Number(process.argv[2] || 30));
