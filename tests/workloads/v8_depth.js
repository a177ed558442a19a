// A JavaScript stack of a set depth, for the V8 walk's cost bench (`cargo xtask bench --only
// node`): `node v8_depth.js DEPTH SECONDS` runs main -> run -> down x (DEPTH - 2), the deepest
// spinning, so a sample of its thread finds DEPTH JavaScript frames, until SECONDS have
// passed.
//
// Every level is a frame of its own, as a service's deep stacks are. A recursion of one
// function would not do: TurboFan inlines a function into itself. Here a level calls the
// next through one of three functions drawn at random for each level of each round: every
// call site sees the three, TurboFan finds it megamorphic and makes a call, inlining none.
//
// The stack is climbed and left again each round (a few hundred microseconds at the bottom),
// so the levels run often enough for TurboFan to compile them within the first seconds; a
// sample lands at the bottom, DEPTH frames deep, all but a small part of the time.
//
// `node v8_depth.js DEPTH SECONDS steady` draws the order once: every round climbs the same
// stack (each call site still sees the three functions, from level to level), so samples
// find one stack, not a new one each round.
"use strict";

// Iterations of the bottom's loop each round: a few hundred microseconds once compiled.
const SPINS = 400000;
let order = [];

function spin(n) {
  let total = 0;
  for (let i = 0; i < n; i++) total = (total + Math.imul(i, i)) ^ (total >>> 3);
  return total;
}

function downA(n) {
  return n === 0 ? spin(SPINS) : (STEPS[order[n - 1]](n - 1) + 1) | 0;
}

function downB(n) {
  return n === 0 ? spin(SPINS) : (STEPS[order[n - 1]](n - 1) + 2) | 0;
}

function downC(n) {
  return n === 0 ? spin(SPINS) : (STEPS[order[n - 1]](n - 1) + 3) | 0;
}

const STEPS = [downA, downB, downC];

const STEADY = process.argv[4] === "steady";

function run(levels) {
  if (!STEADY || order.length !== levels) {
    order = Array.from({ length: levels }, () => Math.floor(Math.random() * 3));
  }
  return STEPS[order[levels - 1]](levels - 1);
}

function main(depth, seconds) {
  // main, run, and the levels below them.
  const levels = Math.max(depth - 2, 1);
  const end = Date.now() + seconds * 1000;
  let total = 0;
  while (Date.now() < end) total = (total + run(levels)) | 0;
  return total;
}

main(Number(process.argv[2] || 50), Number(process.argv[3] || 30));
