//! Folded stacks (the FlameGraph "collapsed" format): `root;...;leaf count` per line.
//!
//! Each stack starts with the process name, then user frames from the outermost caller, then
//! kernel frames suffixed `_[k]` (the FlameGraph convention, which colours them apart).

use std::collections::BTreeMap;

use crate::profile::{Profile, Sample};

/// The folded lines, merged and sorted (so output is deterministic and inferno-ready).
pub fn fold(profile: &Profile) -> Vec<String> {
    fold_samples(profile, profile.samples.iter())
}

/// Like [`fold`], but of the `max_stacks` heaviest samples at most; the others are summed into
/// one line, `[N lighter stacks]`, so the total stays true. The server bounds flame graphs this
/// way: their text and drawing grow with the stacks (60,000 distinct stacks once took 300 MiB),
/// while the stacks left out are each narrower than a pixel of the picture.
pub fn fold_heaviest(profile: &Profile, max_stacks: usize) -> Vec<String> {
    if profile.samples.len() <= max_stacks {
        return fold(profile);
    }
    let mut order: Vec<&Sample> = profile.samples.iter().collect();
    order.select_nth_unstable_by(max_stacks, |a, b| b.count.cmp(&a.count));
    let (kept, rest) = order.split_at(max_stacks);
    let mut lines = fold_samples(profile, kept.iter().copied());
    let rest_count: u64 = rest.iter().map(|s| s.count).sum();
    lines.push(format!("[{} lighter stacks] {rest_count}", rest.len()));
    lines.sort_unstable();
    lines
}

fn fold_samples<'a>(profile: &Profile, samples: impl Iterator<Item = &'a Sample>) -> Vec<String> {
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    for sample in samples {
        let comm = if sample.comm.is_empty() {
            format!("[pid {}]", sample.pid)
        } else {
            sample.comm.clone()
        };
        let mut frames = vec![sanitize(&comm)];
        for &location in sample.locations.iter().rev() {
            let kernel = profile.locations[location].kind.is_kernel();
            // Inlined functions are frames of their own, outermost first.
            for name in profile.location_names(location).iter().rev() {
                let mut name = sanitize(name);
                if kernel {
                    name.push_str("_[k]");
                }
                frames.push(name);
            }
        }
        *merged.entry(frames.join(";")).or_insert(0) += sample.count;
    }
    merged
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect()
}

/// The folded text, one stack per line.
pub fn encode(profile: &Profile) -> String {
    lines_to_text(fold(profile))
}

/// The folded text of [`fold_heaviest`].
pub fn encode_heaviest(profile: &Profile, max_stacks: usize) -> String {
    lines_to_text(fold_heaviest(profile, max_stacks))
}

fn lines_to_text(lines: Vec<String>) -> String {
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

/// `;` separates frames and a newline ends the record; neither may appear inside a name.
fn sanitize(name: &str) -> String {
    name.replace([';', '\n'], "_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::sample_profile;

    #[test]
    fn folds_root_first_with_kernel_suffix() {
        let lines = fold(&sample_profile());
        assert_eq!(
            lines,
            [
                "work;main;[work] 1".to_owned(),
                "work;main;leaf;vfs_read_[k] 3".to_owned(),
            ]
        );
    }

    #[test]
    fn merges_identical_stacks_and_sanitizes() {
        let mut profile = sample_profile();
        let mut copy = profile.samples[0].clone();
        copy.count = 2;
        profile.samples.push(copy);
        profile.locations[2].lines[0].function = "a;b".into();
        // An inlined level becomes a frame below its caller.
        profile.locations[1]
            .lines
            .insert(0, crate::profile::Line::named("inlined"));
        let lines = fold(&profile);
        assert!(
            lines.contains(&"work;a_b;leaf;inlined;vfs_read_[k] 5".to_owned()),
            "{lines:?}"
        );
    }

    #[test]
    fn heaviest_stacks_keep_the_total() {
        let mut profile = crate::profile::sample_profile();
        let all = fold(&profile);
        assert_eq!(fold_heaviest(&profile, profile.samples.len()), all);
        let total: u64 = profile.samples.iter().map(|s| s.count).sum();
        for (i, sample) in profile.samples.iter_mut().enumerate() {
            sample.count = 100 + i as u64;
        }
        let heaviest = profile.samples.last().unwrap().count;
        let lines = fold_heaviest(&profile, 1);
        assert_eq!(lines.len(), 2, "{lines:?}");
        let summed: u64 = lines
            .iter()
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum();
        let new_total: u64 = profile.samples.iter().map(|s| s.count).sum();
        assert_eq!(summed, new_total);
        assert!(total > 0);
        let other = format!(
            "[{} lighter stacks] {}",
            profile.samples.len() - 1,
            new_total - heaviest
        );
        assert!(lines.contains(&other), "{lines:?}");
    }
}
