// A JavaScript call tree with known shares, for the V8 walk's tests:
// main -> run -> {parse, compute -> {matmul x4, reduce x2}, digest}, each call of a leaf one
// unit of CPU time: parse 1, matmul 4, reduce 2, digest 1 of 8 units a round (12.5%, 50%,
// 25%, 12.5%). `node v8_calltree.js SECONDS`.
//
// A unit is time, not a count of iterations (which any CPU makes another share of): a leaf
// runs `spin` in short chunks until its unit of the process's CPU clock has passed. A
// round's unit varies at random around its mean, so rounds never beat against a
// profiler's fixed period. The leaves are small and hot: TurboFan inlines some of them into
// their callers, whose optimised code then stands for several functions at once.
"use strict";

// Iterations of one `spin` call: tens of microseconds, so a leaf overshoots its unit by
// little.
const CHUNK = 20000;
// A unit's mean, in microseconds of CPU time.
const UNIT_US = 2000;

function spin(n) {
  let x = 0;
  for (let i = 0; i < n; i++) x = (x + Math.imul(i, i)) | 0;
  return x;
}

function cpuMicros() {
  const usage = process.cpuUsage();
  return usage.user + usage.system;
}

function parse(unit) {
  let total = 0;
  const end = cpuMicros() + unit;
  while (cpuMicros() < end) total = (total + spin(CHUNK)) | 0;
  return total;
}

function matmul(unit) {
  let total = 0;
  const end = cpuMicros() + unit;
  while (cpuMicros() < end) total = (total + spin(CHUNK)) | 0;
  return total;
}

function reduce(unit) {
  let total = 0;
  const end = cpuMicros() + unit;
  while (cpuMicros() < end) total = (total + spin(CHUNK)) | 0;
  return total;
}

function digest(unit) {
  let total = 0;
  const end = cpuMicros() + unit;
  while (cpuMicros() < end) total = (total + spin(CHUNK)) | 0;
  return total;
}

// The calls are written out: V8's own profiler, the tests' reference, gives the samples of
// a callee inlined into a loop that was replaced on the stack (OSR) to the loop's function.
function compute(unit) {
  const total = (matmul(unit) + matmul(unit) + matmul(unit) + matmul(unit)) | 0;
  return (total + reduce(unit) + reduce(unit)) | 0;
}

function run(unit) {
  return (parse(unit) + compute(unit) + digest(unit)) | 0;
}

function main(seconds) {
  const end = Date.now() + seconds * 1000;
  let total = 0;
  while (Date.now() < end) {
    const unit = UNIT_US * (0.5 + Math.random());
    total = (total + run(unit)) | 0;
  }
  return total;
}

main(Number(process.argv[2] || 30));
