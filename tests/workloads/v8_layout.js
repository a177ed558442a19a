// Functions at known tiers, printed by V8 itself (run with --allow-natives-syntax), for the
// V8 layout test (tests/tests/integration/v8_layout.rs): it reads each function's fields
// from this process's memory at the addresses %DebugPrint gives, with the layout scorch
// reads from the build. Run with --expose-gc too: two full collections first move the
// objects to the old space, where no scavenge moves them between the print and the reads.
// Keeps running until killed.
function optimised(n) {
  let s = 0;
  for (let i = 0; i < n; i++) s += i * i;
  return s;
}
function interpreted(n) {
  return n + 1;
}
// A class constructor: a subclass of JSFunction, with an instance type of its own.
class Shape {
  constructor(x) {
    this.x = x;
  }
}
%PrepareFunctionForOptimization(optimised);
optimised(10);
optimised(10);
%OptimizeFunctionOnNextCall(optimised);
optimised(10);
interpreted(1);
new Shape(1);
gc();
gc();
for (const f of [optimised, interpreted, Shape]) {
  console.log(`function ${f.name}`);
  %DebugPrint(f);
}
console.log("ready");
setInterval(() => {}, 1000);
