//! A runtime plugged in through the registry, as HotSpot, V8 and Ruby will be: a test double
//! whose frames come out of the symbolizer named by its own `Names` and with its kind, and
//! keep both through pprof, the store and OTLP. No BPF: its frames are the words a runtime's
//! walk would write, given to the symbolizer as the drain hands them on.

use std::{any::Any, sync::Arc, time::SystemTime};

use anyhow::{ensure, Context, Result};
use prost::Message as _;
use scorch::{
    export::otlp::convert::{window_requests, ConvertOptions},
    parse::timespec::TimeRange,
    pipeline::{
        aggregate::{Aggregated, StackSample, WindowTotal},
        drain::{Stack, ThreadTag},
        frames::Frame,
        maps::RuntimeCounters,
    },
    profile::{encode::pprof, FrameKind, Line, Profile},
    runtimes::{image::Image, Binary, Names, Registry, Runtime, UNKNOWN_RUNTIME_FRAME},
    store::{Retention, Store},
    symbolize::{kernel::KernelSymbolizer, symbolize, user::UserSymbolizer},
};
use scorch_common::{RuntimeId, WordKind};
use scorch_tests::{fake_otlp::decode_export, named_samples, NamedSample};

use crate::remote::fresh_dir;

/// The double: its frame words carry Python's kind (the one runtime id there is; a new
/// runtime adds its own, ARCHITECTURE.md's "where changes go"), their payload a function
/// number its `Names` turns into a name.
#[derive(Debug)]
struct Double;

impl Runtime for Double {
    fn id(&self) -> RuntimeId {
        RuntimeId::Python
    }
    fn name(&self) -> &'static str {
        "double"
    }
    fn frame_kind(&self) -> FrameKind {
        FrameKind::Python
    }
    fn procs_map(&self) -> &'static str {
        "DOUBLE_PROCS"
    }
    fn thread_pointer(&self) -> bool {
        false
    }
    fn counters(&self) -> RuntimeCounters {
        RuntimeCounters {
            runtime: "double",
            map: "DOUBLE_COUNTS",
            names: &["frames"],
        }
    }
    fn may_be(&self, _: &object::File) -> bool {
        false
    }
    fn detect(&self, _: &Image) -> Result<Option<Arc<dyn Binary>>, String> {
        Ok(None)
    }
    fn names(&self) -> Box<dyn Names> {
        Box::new(DoubleNames::default())
    }
}

/// Names `double_fn_N` for payload N, in a process the loader attached it to.
#[derive(Default)]
struct DoubleNames {
    /// Processes attached, with what the attachment gave (a file name).
    processes: std::collections::HashMap<u32, String>,
    named: u64,
    unknown: u64,
}

impl Names for DoubleNames {
    fn attach(&mut self, pid: u32, process: Option<Arc<dyn Any + Send + Sync>>) {
        match process.and_then(|p| p.downcast_ref::<String>().cloned()) {
            Some(file) => self.processes.insert(pid, file),
            None => self.processes.remove(&pid),
        };
    }
    fn capture(&mut self, _: u32, _: u64, _: u64) {}
    fn end_window(&mut self, _: &dyn Fn(u32) -> bool) {}
    fn lines(&mut self, pid: u32, word: u64, _: u64) -> Vec<Line> {
        let Some(file) = self.processes.get(&pid) else {
            self.unknown += 1;
            return vec![Line::named("[double: unknown]")];
        };
        self.named += 1;
        let number = scorch_common::word_payload(word);
        vec![Line {
            file: Some(file.clone()),
            line: number as u32,
            ..Line::named(format!("double_fn_{number}"))
        }]
    }
    fn counts(&self) -> (u64, u64) {
        (self.named, self.unknown)
    }
    /// Its names are made from the word, never kept.
    fn window_bytes(&self) -> usize {
        0
    }
}

/// Process ids no process has (above the kernel's most, 2^22).
const PID: u32 = 4_500_000;

/// One window of one stack: two of the double's frames (leaf first) over a native pc no
/// mapping holds.
fn window() -> Aggregated {
    let mut aggregated = Aggregated::default();
    let stack = StackSample {
        tgid: PID,
        maps_version: 0,
        user: Stack::Frames(vec![
            Frame::Runtime(WordKind::Python.word(7), 0),
            Frame::Runtime(WordKind::Python.word(3), 0),
            Frame::Native(0x1000),
        ]),
        kernel: Stack::Absent,
        thread: ThreadTag::default(),
        block: None,
    };
    aggregated.stacks.insert(stack, 5);
    aggregated.windows.push(WindowTotal {
        start: SystemTime::now(),
        end: SystemTime::now(),
        samples: 5,
    });
    aggregated
}

fn profile_with(registry: &Registry) -> Result<(Profile, UserSymbolizer)> {
    let mut user = UserSymbolizer::default();
    user.set_runtimes(registry);
    user.runtimes().attach(
        PID,
        RuntimeId::Python,
        Some(Arc::new(String::from("/srv/app.double")) as Arc<dyn Any + Send + Sync>),
    );
    let mut profile = symbolize(
        &window(),
        &mut KernelSymbolizer::one_profile(),
        &mut user,
        52_631_578,
        |_| Some("double".into()),
    )?;
    profile.start = SystemTime::now() - std::time::Duration::from_secs(10);
    profile.duration = std::time::Duration::from_secs(10);
    Ok((profile, user))
}

/// The frames of `samples`' one sample (the window has one stack) that the double's words
/// became: (name, kind code), leaf first.
fn frames_of(samples: &[NamedSample]) -> Result<Vec<(String, u32)>> {
    let [sample] = samples else {
        anyhow::bail!("not one sample: {samples:?}");
    };
    ensure!(
        sample.frames.len() == 3,
        "not the window's stack: {sample:?}"
    );
    Ok(sample
        .frames
        .iter()
        .cloned()
        .zip(sample.kinds.iter().copied())
        .take(2)
        .collect())
}

#[test]
fn a_runtime_double_plugged_into_the_registry_names_its_frames_with_its_kind() -> Result<()> {
    let python = FrameKind::Python.code() as u32;
    let expected = vec![
        ("double_fn_7".to_string(), python),
        ("double_fn_3".to_string(), python),
    ];

    // Without it in the registry, its words are nobody's: unknown, and native.
    let (profile, _) = profile_with(&Registry::of(Vec::new()))?;
    let frames = frames_of(&named_samples(&pprof::to_message(&profile)))?;
    ensure!(
        frames
            == vec![
                (UNKNOWN_RUNTIME_FRAME.to_string(), 0),
                (UNKNOWN_RUNTIME_FRAME.to_string(), 0)
            ],
        "unregistered: {frames:?}"
    );

    let (profile, user) = profile_with(&Registry::of(vec![Arc::new(Double)]))?;
    ensure!(
        user.runtime_counts() == vec![("double", (2, 0))],
        "the double's counts: {:?}",
        user.runtime_counts()
    );
    let located = profile
        .locations
        .iter()
        .find(|l| l.lines[0].function == "double_fn_7")
        .context("no location named by the double")?;
    ensure!(
        located.kind == FrameKind::Python
            && located.lines[0].file.as_deref() == Some("/srv/app.double")
            && located.lines[0].line == 7,
        "{located:?}"
    );

    // pprof: scorch's own Location field carries the kind.
    let frames = frames_of(&named_samples(&pprof::to_message(&profile)))?;
    ensure!(frames == expected, "pprof: {frames:?}");

    // The store keeps it, and its query gives it back.
    let dir = fresh_dir("runtime-double-store")?;
    let mut store = Store::open(&dir, Retention::default())?;
    store.write_window(&profile)?;
    let everything = TimeRange {
        from: SystemTime::UNIX_EPOCH,
        to: SystemTime::now() + std::time::Duration::from_secs(3600),
    };
    let queried = store.query(everything, &|_| true)?;
    let frames = frames_of(&named_samples(&pprof::to_message(&queried)))?;
    ensure!(frames == expected, "the store: {frames:?}");

    // OTLP: `profile.frame.type` from the kind, read back by the test receiver's decoder
    // (which turns it into the same pprof field).
    let options = ConvertOptions {
        host_name: "test-host".into(),
        max_bytes: 1 << 20,
    };
    let mut received = Vec::new();
    for request in window_requests(&profile, &options) {
        for profile in decode_export(&request.encode_to_vec())? {
            received.extend(named_samples(&scorch::pprof::Profile::decode(
                &profile.pprof[..],
            )?));
        }
    }
    let frames = frames_of(&received)?;
    ensure!(frames == expected, "OTLP: {frames:?}");
    Ok(())
}
