//! Another process, as the unwinder and the symbolizer both see it: its executable mappings
//! (`maps`: /proc/PID/maps or `PROCMAP_QUERY`, versioned as libraries come and go) and the
//! captures of them kept after it exits (`captures`), bounded.
//!
//! Everything here is read from /proc/PID, which the process's owner controls: bounded, and
//! wrong input is an error naming the process, never a crash.

pub mod captures;
pub mod maps;
