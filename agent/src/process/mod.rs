//! Another process, as the unwinder and the symbolizer both see it: its executable mappings
//! (`maps`: /proc/PID/maps or `PROCMAP_QUERY`, versioned as libraries come and go) and the
//! captures of them kept after it exits (`captures`), bounded; the files it maps, opened
//! safely (`open`); a JIT's perf map (`perf_map`).
//!
//! Everything here is read from /proc/PID, which the process's owner controls: bounded, and
//! wrong input is an error naming the process, never a crash.

pub mod captures;
pub mod maps;
pub mod open;
pub mod perf_map;
