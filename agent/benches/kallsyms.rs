//! kallsyms load time and lookup latency on this machine's live /proc/kallsyms.
//! Run with `cargo bench -p scorch --bench kallsyms` (or `cargo xtask bench`).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use scorch::symbolize::kernel::KernelSymbols;

fn kallsyms(c: &mut Criterion) {
    let mut group = c.benchmark_group("kallsyms");
    group.sample_size(30);
    group.bench_function("load /proc/kallsyms", |b| {
        b.iter(|| KernelSymbols::load().expect("reading /proc/kallsyms"))
    });
    group.finish();

    let table = KernelSymbols::load().expect("reading /proc/kallsyms");
    // Addresses spread over the whole table, a few bytes into functions, visited in a
    // cache-unfriendly order, like the return addresses of real stacks.
    let text = std::fs::read_to_string("/proc/kallsyms").expect("reading /proc/kallsyms");
    let mut addresses: Vec<u64> = text
        .lines()
        .filter(|l| l.split(' ').nth(1).is_some_and(|t| matches!(t, "t" | "T")))
        .filter_map(|l| u64::from_str_radix(l.split(' ').next()?, 16).ok())
        .step_by(7)
        .map(|a| a + 0x11)
        .collect();
    let len = addresses.len();
    addresses.rotate_left(len / 3);
    for i in (0..len).step_by(2) {
        addresses.swap(i, (i * 7919) % len);
    }
    println!(
        "kallsyms: {} symbols, looking up {} addresses",
        table.len(),
        len
    );
    let mut i = 0;
    c.bench_function("kallsyms lookup", |b| {
        b.iter(|| {
            i = (i + 1) % len;
            black_box(table.lookup(black_box(addresses[i])))
        })
    });
}

criterion_group!(benches, kallsyms);
criterion_main!(benches);
