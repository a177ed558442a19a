//! Sampling, in the order samples flow: [`frames`] is the typed frame the stack words the
//! BPF program writes are decoded into once; [`sampler`] loads and attaches the BPF program,
//! [`drain`] reads and resets its maps into a [`drain::RawWindow`] without losing a sample,
//! and [`aggregate`] merges windows. [`cost`] reads what the BPF side costs the kernel.
//! [`stack_sizing`] decides how large each generation's stack-trace map is, from the stacks
//! its windows stored. [`off_cpu`] reads the blocks the scheduler hook recorded (`--off-cpu`).

pub mod frames;
pub mod aggregate;
pub mod cost;
pub mod drain;
pub mod maps;
pub mod off_cpu;
pub mod sampler;
pub mod stack_sizing;
