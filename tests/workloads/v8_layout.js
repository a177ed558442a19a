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
// Compiled functions keep their name in their ScopeInfo, after their context's locals: one
// with two, one with more than V8 keeps inline (75), and a named function expression, whose
// own name is a variable of its scope.
function captures(n) {
  let a = n;
  let b = n + 1;
  return () => a + b;
}
function manyLocals(n) {
  let v0 = n + 0, v1 = n + 1, v2 = n + 2, v3 = n + 3, v4 = n + 4, v5 = n + 5, v6 = n + 6, v7 = n + 7, v8 = n + 8, v9 = n + 9, v10 = n + 10, v11 = n + 11, v12 = n + 12, v13 = n + 13, v14 = n + 14, v15 = n + 15, v16 = n + 16, v17 = n + 17, v18 = n + 18, v19 = n + 19, v20 = n + 20, v21 = n + 21, v22 = n + 22, v23 = n + 23, v24 = n + 24, v25 = n + 25, v26 = n + 26, v27 = n + 27, v28 = n + 28, v29 = n + 29, v30 = n + 30, v31 = n + 31, v32 = n + 32, v33 = n + 33, v34 = n + 34, v35 = n + 35, v36 = n + 36, v37 = n + 37, v38 = n + 38, v39 = n + 39, v40 = n + 40, v41 = n + 41, v42 = n + 42, v43 = n + 43, v44 = n + 44, v45 = n + 45, v46 = n + 46, v47 = n + 47, v48 = n + 48, v49 = n + 49, v50 = n + 50, v51 = n + 51, v52 = n + 52, v53 = n + 53, v54 = n + 54, v55 = n + 55, v56 = n + 56, v57 = n + 57, v58 = n + 58, v59 = n + 59, v60 = n + 60, v61 = n + 61, v62 = n + 62, v63 = n + 63, v64 = n + 64, v65 = n + 65, v66 = n + 66, v67 = n + 67, v68 = n + 68, v69 = n + 69, v70 = n + 70, v71 = n + 71, v72 = n + 72, v73 = n + 73, v74 = n + 74, v75 = n + 75, v76 = n + 76, v77 = n + 77, v78 = n + 78, v79 = n + 79;
  return () => v0 + v1 + v2 + v3 + v4 + v5 + v6 + v7 + v8 + v9 + v10 + v11 + v12 + v13 + v14 + v15 + v16 + v17 + v18 + v19 + v20 + v21 + v22 + v23 + v24 + v25 + v26 + v27 + v28 + v29 + v30 + v31 + v32 + v33 + v34 + v35 + v36 + v37 + v38 + v39 + v40 + v41 + v42 + v43 + v44 + v45 + v46 + v47 + v48 + v49 + v50 + v51 + v52 + v53 + v54 + v55 + v56 + v57 + v58 + v59 + v60 + v61 + v62 + v63 + v64 + v65 + v66 + v67 + v68 + v69 + v70 + v71 + v72 + v73 + v74 + v75 + v76 + v77 + v78 + v79;
}
const expression = function named(n) {
  return n > 0 ? named(n - 1) : 0;
};
// A function without a name of its own (`f.name` is empty), whose name V8 infers from the
// assignment, as its profiler shows it: printed as `function inferred NAME`.
const holder = {};
holder.method = function (n) {
  return n + 2;
};
%PrepareFunctionForOptimization(optimised);
optimised(10);
optimised(10);
%OptimizeFunctionOnNextCall(optimised);
optimised(10);
interpreted(1);
new Shape(1);
captures(1)();
manyLocals(1)();
expression(2);
holder.method(1);
gc();
gc();
for (const f of [optimised, interpreted, Shape, captures, manyLocals, expression]) {
  console.log(`function ${f.name}`);
  %DebugPrint(f);
}
console.log("function inferred holder.method");
%DebugPrint(holder.method);
console.log("ready");
setInterval(() => {}, 1000);
