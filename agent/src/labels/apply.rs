//! Applying the outcomes of relabelling to a window: before symbolising, the samples of
//! dropped processes and threads go ([`discard_dropped`]); after it, each sample gets its
//! series' labels ([`label`]). Pure: what each process and thread became is asked of a
//! [`Judge`] (the [`Labeler`](super::Labeler), which reads /proc, or a table in tests).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use super::{relabel::Outcome, Labeler, Missing};
use crate::{
    pipeline::aggregate::{Aggregated, OTHER_THREADS},
    profile::{Labels, Profile, STATE_LABEL, THREAD_ID_LABEL, THREAD_LABEL},
};

/// What relabelling made of each process and thread.
pub trait Judge {
    /// Whether any rule can drop a process.
    fn can_drop(&self) -> bool;
    /// Whether a rule reads a thread's labels (then a thread may be dropped while its process
    /// is kept).
    fn reads_threads(&self) -> bool;
    /// The process's outcome, and what its labels lack.
    fn judge(&mut self, pid: u32) -> (Arc<Outcome>, Option<Missing>);
    /// The outcome of one thread of `pid`, by its name and (with thread ids) its id.
    fn thread_outcome(&mut self, pid: u32, name: &str, id: Option<u32>) -> Arc<Outcome>;
}

impl Judge for Labeler {
    fn can_drop(&self) -> bool {
        Labeler::can_drop(self)
    }

    fn reads_threads(&self) -> bool {
        Labeler::reads_threads(self)
    }

    fn judge(&mut self, pid: u32) -> (Arc<Outcome>, Option<Missing>) {
        Labeler::judge(self, pid)
    }

    fn thread_outcome(&mut self, pid: u32, name: &str, id: Option<u32>) -> Arc<Outcome> {
        Labeler::thread_outcome(self, pid, name, id)
    }
}

fn dropped(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Dropped { .. })
}

/// Removes the samples of processes relabelling drops (those sampled before the BPF deny
/// list had them) and, when rules read a thread's labels, of the threads they drop. Run
/// before symbolising: a dropped process's binaries are then never parsed and its perf map
/// never read, so a busy host's compilers do not fill the symbol cache of a daemon told to
/// profile one service.
pub fn discard_dropped(judge: &mut impl Judge, aggregated: &mut Aggregated) {
    if !judge.can_drop() {
        return;
    }
    let threads = judge.reads_threads();
    let mut processes: HashMap<u32, bool> = HashMap::new();
    aggregated.stacks.retain(|stack, _| {
        let process = *processes
            .entry(stack.tgid)
            .or_insert_with(|| dropped(&judge.judge(stack.tgid).0));
        if process {
            return false;
        }
        !(threads
            && dropped(&judge.thread_outcome(stack.tgid, &stack.thread.name, stack.thread.id)))
    });
}

/// A thread of a process: pid, thread name, thread id.
type ThreadKey = (u32, String, Option<u32>);

/// Gives each sample its series' labels: its process's and thread's, relabelled, and for
/// off-CPU time its `state`. Removes the samples of dropped processes and threads (those
/// [`discard_dropped`] did not see). Returns the samples whose labels lack something, by
/// [`Missing::as_str`].
pub fn label(judge: &mut impl Judge, profile: &mut Profile) -> BTreeMap<&'static str, u64> {
    // One outcome per process, then one label set per thread (None: dropped), and one per
    // (thread, state).
    let mut per_process: HashMap<u32, (Arc<Outcome>, Option<Missing>)> = HashMap::new();
    let mut per_thread: HashMap<ThreadKey, Option<Arc<Labels>>> = HashMap::new();
    let mut per_state: HashMap<(ThreadKey, String), Arc<Labels>> = HashMap::new();
    let mut unlabelled: BTreeMap<&'static str, u64> = BTreeMap::new();
    profile.samples.retain_mut(|sample| {
        let (process, missing) = per_process
            .entry(sample.pid)
            .or_insert_with(|| judge.judge(sample.pid))
            .clone();
        let Outcome::Keep(process_labels) = &*process else {
            return false;
        };
        if let Some(missing) = missing {
            *unlabelled.entry(missing.as_str()).or_default() += sample.count;
        }
        let (name, id) = thread_of(&sample.labels);
        let key = (sample.pid, name.to_owned(), id);
        let labels = per_thread.entry(key.clone()).or_insert_with(|| {
            let mut labels = match &*judge.thread_outcome(sample.pid, name, id) {
                Outcome::Keep(labels) => labels.clone(),
                // The folded threads were each kept (`discard_dropped` judged them by their
                // own names): a rule dropping the name they share does not drop them again;
                // they get their process's labels.
                Outcome::Dropped { .. } if name == OTHER_THREADS => {
                    let mut labels = process_labels.clone();
                    labels.insert(THREAD_LABEL.to_owned(), OTHER_THREADS.to_owned());
                    labels
                }
                Outcome::Dropped { .. } => return None,
            };
            // The name read while the process ran beats a late read of /proc.
            if labels.contains_key("comm") && !sample.comm.is_empty() {
                labels.insert("comm".to_owned(), sample.comm.clone());
            }
            Some(Arc::new(labels))
        });
        let Some(labels) = labels else {
            return false;
        };
        // Off-CPU samples keep the state they blocked in beside their thread's labels.
        sample.labels = match sample.labels.get(STATE_LABEL) {
            None => labels.clone(),
            Some(state) => per_state
                .entry((key, state.clone()))
                .or_insert_with(|| {
                    let mut merged = (**labels).clone();
                    merged.insert(STATE_LABEL.to_owned(), state.clone());
                    Arc::new(merged)
                })
                .clone(),
        };
        true
    });
    unlabelled
}

/// A sample's thread name and id, from the labels symbolising gave it.
fn thread_of(labels: &Labels) -> (&str, Option<u32>) {
    (
        labels.get(THREAD_LABEL).map_or("", String::as_str),
        labels.get(THREAD_ID_LABEL).and_then(|id| id.parse().ok()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pipeline::{
            aggregate::StackSample,
            drain::{Stack, ThreadTag},
        },
        profile::Sample,
    };

    /// Outcomes from tables: processes by pid, threads by (pid, name).
    #[derive(Default)]
    struct Table {
        processes: HashMap<u32, (Outcome, Option<Missing>)>,
        threads: HashMap<(u32, String), Outcome>,
        reads_threads: bool,
        judged: Vec<u32>,
    }

    impl Table {
        fn keep(mut self, pid: u32, labels: &[(&str, &str)]) -> Self {
            self.processes
                .insert(pid, (Outcome::Keep(labels_of(labels)), None));
            self
        }

        fn drop_process(mut self, pid: u32) -> Self {
            self.processes
                .insert(pid, (Outcome::Dropped { rule: 0 }, None));
            self
        }

        fn drop_thread(mut self, pid: u32, name: &str) -> Self {
            self.reads_threads = true;
            self.threads
                .insert((pid, name.to_owned()), Outcome::Dropped { rule: 1 });
            self
        }
    }

    impl Judge for Table {
        fn can_drop(&self) -> bool {
            true
        }

        fn reads_threads(&self) -> bool {
            self.reads_threads
        }

        fn judge(&mut self, pid: u32) -> (Arc<Outcome>, Option<Missing>) {
            self.judged.push(pid);
            let (outcome, missing) = self.processes[&pid].clone();
            (Arc::new(outcome), missing)
        }

        fn thread_outcome(&mut self, pid: u32, name: &str, _: Option<u32>) -> Arc<Outcome> {
            let process = self.processes[&pid].0.clone();
            let outcome = match (process, self.threads.get(&(pid, name.to_owned()))) {
                (Outcome::Keep(_), Some(thread)) => thread.clone(),
                (Outcome::Keep(mut labels), None) => {
                    if !name.is_empty() {
                        labels.insert(THREAD_LABEL.to_owned(), name.to_owned());
                    }
                    Outcome::Keep(labels)
                }
                (dropped, _) => dropped,
            };
            Arc::new(outcome)
        }
    }

    fn labels_of(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sample(pid: u32, comm: &str, labels: &[(&str, &str)], count: u64) -> Sample {
        Sample {
            pid,
            comm: comm.to_owned(),
            labels: Arc::new(labels_of(labels)),
            locations: Vec::new(),
            count,
        }
    }

    fn profile(samples: Vec<Sample>) -> Profile {
        Profile {
            start: std::time::SystemTime::UNIX_EPOCH,
            duration: std::time::Duration::from_secs(10),
            period_ns: 1,
            sample_type: Default::default(),
            mappings: Vec::new(),
            locations: Vec::new(),
            samples,
        }
    }

    fn stack(tgid: u32, thread: &str) -> StackSample {
        StackSample {
            tgid,
            maps_version: 0,
            user: Stack::Absent,
            kernel: Stack::Absent,
            thread: ThreadTag {
                name: thread.to_owned(),
                id: None,
            },
            block: None,
        }
    }

    #[test]
    fn a_sample_names_its_thread() {
        let process_only = labels_of(&[("comm", "a")]);
        assert_eq!(thread_of(&process_only), ("", None));
        let cpu = labels_of(&[("comm", "a"), ("thread", "worker"), ("thread_id", "12")]);
        assert_eq!(thread_of(&cpu), ("worker", Some(12)));
    }

    #[test]
    fn dropped_processes_and_threads_leave_the_window_before_symbolising() {
        let mut table = Table::default()
            .keep(1, &[("job", "a")])
            .drop_process(2)
            .drop_thread(1, "noisy");
        let mut aggregated = Aggregated::default();
        for (key, count) in [
            (stack(1, "main"), 3),
            (stack(1, "noisy"), 4),
            (stack(2, "x"), 5),
        ] {
            aggregated.stacks.insert(key, count);
        }
        discard_dropped(&mut table, &mut aggregated);
        let left: Vec<_> = aggregated
            .stacks
            .keys()
            .map(|s| (s.tgid, s.thread.name.as_str()))
            .collect();
        assert_eq!(left, [(1, "main")]);
        // A process's outcome is asked for once, however many of its stacks there are.
        assert_eq!(table.judged.iter().filter(|&&pid| pid == 2).count(), 1);
    }

    #[test]
    fn samples_take_their_series_labels_and_keep_their_state_and_live_comm() {
        let mut table = Table::default()
            .keep(1, &[("comm", "late"), ("job", "a")])
            .drop_process(2);
        table.processes.get_mut(&1).unwrap().1 = Some(Missing::Executable);
        let mut profile = profile(vec![
            sample(1, "early", &[("thread", "w")], 2),
            sample(1, "early", &[("thread", "w"), ("state", "sleeping")], 7),
            sample(2, "gone", &[], 9),
        ]);
        let unlabelled = label(&mut table, &mut profile);
        assert_eq!(
            profile.samples.len(),
            2,
            "the dropped process's sample goes"
        );
        assert_eq!(
            *profile.samples[0].labels,
            labels_of(&[("comm", "early"), ("job", "a"), ("thread", "w")])
        );
        assert_eq!(
            *profile.samples[1].labels,
            labels_of(&[
                ("comm", "early"),
                ("job", "a"),
                ("state", "sleeping"),
                ("thread", "w")
            ])
        );
        assert_eq!(
            unlabelled,
            BTreeMap::from([(Missing::Executable.as_str(), 9)])
        );
    }

    #[test]
    fn folded_threads_keep_their_process_labels_when_a_rule_drops_their_shared_name() {
        let mut table = Table::default()
            .keep(1, &[("job", "a")])
            .drop_thread(1, OTHER_THREADS)
            .drop_thread(1, "noisy");
        let mut profile = profile(vec![
            sample(1, "", &[("thread", OTHER_THREADS)], 1),
            sample(1, "", &[("thread", "noisy")], 1),
        ]);
        label(&mut table, &mut profile);
        assert_eq!(profile.samples.len(), 1);
        assert_eq!(
            *profile.samples[0].labels,
            labels_of(&[("job", "a"), ("thread", OTHER_THREADS)])
        );
    }
}
