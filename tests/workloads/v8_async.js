// Two shapes of a Node service, for the V8 walk's tests: the main thread serves "requests"
// through async functions (each `await` resumes its function from V8's microtask queue, not
// from its caller), and a worker thread (its own V8 isolate, in the same process) runs a
// plain loop. Each spends its time in `busy` -> `spin`. `node v8_async.js SECONDS`.
"use strict";
const { Worker, isMainThread } = require("node:worker_threads");

function spin(n) {
  let x = 0;
  for (let i = 0; i < n; i++) x = (x + Math.imul(i, i)) | 0;
  return x;
}

function busy(ms) {
  const end = Date.now() + ms;
  let total = 0;
  while (Date.now() < end) total = (total + spin(20000)) | 0;
  return total;
}

async function fetchRecord(ms) {
  await null;
  return busy(ms);
}

async function handleRequest() {
  let total = 0;
  for (let i = 0; i < 3; i++) total += await fetchRecord(5);
  return total;
}

async function serve(seconds) {
  const end = Date.now() + seconds * 1000;
  while (Date.now() < end) await handleRequest();
}

function workerLoop(seconds) {
  const end = Date.now() + seconds * 1000;
  while (Date.now() < end) busy(10);
}

const seconds = Number(process.argv[2] || 20);
if (isMainThread) {
  new Worker(__filename, { argv: [String(seconds)] });
  serve(seconds);
} else {
  workerLoop(seconds);
}
