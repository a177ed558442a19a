//! Integration tests: the real BPF program, attached on this machine's kernel, profiling
//! workloads built here. Run through `cargo xtask test`, which runs them one at a time.

mod adversarial;
mod batch;
mod build_host;
mod cli;
mod counting;
mod daemon;
mod debug_memory;
mod go;
mod kernel_frames;
mod jvm;
mod known_call_tree;
mod kubernetes;
mod labels;
mod off_cpu;
mod off_cpu_run;
mod otlp;
mod pprof_url;
mod python;
mod privileges;
mod real_hosts;
mod remote;
mod runtime_double;
mod short_lived_labels;
mod symbols;
mod threads;
mod ui;
mod ui_compare;
mod ui_flame;
mod unwind;
mod v8_layout;
mod v8_walk;
mod workloads;
