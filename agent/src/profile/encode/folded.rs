//! Folded stacks (the FlameGraph "collapsed" format): `root;...;leaf count` per line.
//!
//! Each stack starts with the process name, then user frames from the outermost caller, then
//! kernel frames suffixed `_[k]` (the FlameGraph convention, which colours them apart).

use std::collections::BTreeMap;

use crate::profile::Profile;

/// The folded lines, merged and sorted (so output is deterministic and inferno-ready).
pub fn fold(profile: &Profile) -> Vec<String> {
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    for sample in &profile.samples {
        let comm = if sample.comm.is_empty() {
            format!("[pid {}]", sample.pid)
        } else {
            sample.comm.clone()
        };
        let mut frames = vec![sanitize(&comm)];
        for &location in sample.locations.iter().rev() {
            let kernel = profile.locations[location].kernel;
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
    let mut text = fold(profile).join("\n");
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
}
