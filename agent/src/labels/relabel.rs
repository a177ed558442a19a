//! Relabelling: Prometheus `relabel_config` semantics over a process's discovered labels.
//!
//! The rules come from the config file and are checked at startup, so a bad regex or an
//! unknown action is a startup error naming the rule and the field. Applying them is pure:
//! labels in, labels out (or `None` when a `keep`/`drop` rule drops the process).

use std::fmt;

use md5::{Digest, Md5};
use regex::Regex;
use serde::Deserialize;

use crate::{parse::selector::whole_value_regex, profile::Labels};

/// Compiled size of one rule's regex (the `regex` crate's own measure; its default is 10 MiB).
/// Rules are compiled at startup and run against every new process's labels: a pattern like
/// `\w{1000}` would cost hundreds of MiB and seconds to compile. A rule's regex is a few
/// names or an alternation of a few hundred; 1 MiB holds that many times over.
pub const MAX_REGEX_BYTES: usize = 1 << 20;
/// The lazy DFA's cache per rule's regex.
const MAX_REGEX_DFA_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RelabelError {
    #[error("relabel rule {rule}: field `{field}`: {message}")]
    Rule {
        /// 1-based position of the rule in the config.
        rule: usize,
        field: &'static str,
        message: String,
    },
}

/// One rule as written in the config file (`[[relabel]]`), with Prometheus's field names.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    #[serde(default)]
    pub source_labels: Vec<String>,
    pub separator: Option<String>,
    pub regex: Option<String>,
    pub modulus: Option<u64>,
    pub target_label: Option<String>,
    pub replacement: Option<String>,
    pub action: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Replace,
    Keep,
    Drop,
    HashMod,
    LabelMap,
    LabelDrop,
    LabelKeep,
    Lowercase,
    Uppercase,
}

impl Action {
    fn parse(text: &str) -> Option<Action> {
        Some(match text {
            "replace" => Action::Replace,
            "keep" => Action::Keep,
            "drop" => Action::Drop,
            "hashmod" => Action::HashMod,
            "labelmap" => Action::LabelMap,
            "labeldrop" => Action::LabelDrop,
            "labelkeep" => Action::LabelKeep,
            "lowercase" => Action::Lowercase,
            "uppercase" => Action::Uppercase,
            _ => return None,
        })
    }
}

/// A checked rule, ready to apply.
#[derive(Debug, Clone)]
pub struct Rule {
    /// 1-based position in the config, for messages.
    pub index: usize,
    source_labels: Vec<String>,
    separator: String,
    /// Anchored like Prometheus: `^(?:regex)$`, the pattern a regex by itself (see
    /// [`whole_value_regex`]).
    regex: Regex,
    modulus: u64,
    target_label: String,
    replacement: String,
    pub action: Action,
}

/// The longest label name or value a rule may set. Rules can feed each other: a chain of
/// `replacement = "$1$1"` doubles a value per rule, 2^40 bytes after forty of them. Real
/// values are paths at most (4 KiB), and the backends refuse far less (Pyroscope: 2 KiB).
pub const MAX_LABEL_BYTES: usize = 16 << 10;

/// A label a rule produced that Prometheus and Pyroscope would refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidLabel {
    pub rule: usize,
    /// The name, cut to its first 64 characters when the problem is its length.
    pub name: String,
    pub problem: LabelProblem,
}

/// What is wrong with an [`InvalidLabel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelProblem {
    /// Not `[a-zA-Z_][a-zA-Z0-9_]*`.
    Name,
    /// The name or the value is over [`MAX_LABEL_BYTES`]; `bytes` is the longer one's length.
    TooLong { bytes: usize },
}

impl fmt::Display for InvalidLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.problem {
            LabelProblem::Name => write!(
                f,
                "relabel rule {} produced the label name {:?}, which is not a valid label name \
                 ([a-zA-Z_][a-zA-Z0-9_]*); the label was not set",
                self.rule, self.name
            ),
            LabelProblem::TooLong { bytes } => write!(
                f,
                "relabel rule {} produced a label name or value of {bytes} bytes (label {:?}), \
                 more than the {MAX_LABEL_BYTES} allowed; the label was not set",
                self.rule, self.name
            ),
        }
    }
}

/// `name` cut to its first 64 characters, to name a label too long to print whole.
fn shortened(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((end, _)) => format!("{}...", &name[..end]),
        None => name.to_owned(),
    }
}

impl Rule {
    pub fn new(index: usize, config: &RuleConfig) -> Result<Rule, RelabelError> {
        let error = |field: &'static str, message: String| RelabelError::Rule {
            rule: index,
            field,
            message,
        };
        let action = match &config.action {
            None => Action::Replace,
            Some(text) => Action::parse(&text.to_ascii_lowercase()).ok_or_else(|| {
                error(
                    "action",
                    format!(
                        "unknown action {text:?} (replace, keep, drop, hashmod, labelmap, \
                         labeldrop, labelkeep, lowercase, uppercase)"
                    ),
                )
            })?,
        };
        let pattern = config.regex.clone().unwrap_or_else(|| "(.*)".to_owned());
        let regex = whole_value_regex(&pattern, "", MAX_REGEX_BYTES, MAX_REGEX_DFA_BYTES)
            .map_err(|e| error("regex", format!("{pattern:?}: {e}")))?;
        let target_label = config.target_label.clone().unwrap_or_default();
        let needs_target = matches!(
            action,
            Action::Replace | Action::HashMod | Action::Lowercase | Action::Uppercase
        );
        if needs_target && target_label.is_empty() {
            return Err(error(
                "target_label",
                format!("the {action:?} action needs a target_label").to_lowercase(),
            ));
        }
        // A target with `$1`-style references is checked once expanded; a plain one now.
        if needs_target && !target_label.contains('$') && !valid_label_name(&target_label) {
            return Err(error(
                "target_label",
                format!("{target_label:?} is not a valid label name"),
            ));
        }
        let modulus = config.modulus.unwrap_or(0);
        if action == Action::HashMod && modulus == 0 {
            return Err(error(
                "modulus",
                "the hashmod action needs a modulus above 0".into(),
            ));
        }
        if matches!(action, Action::LabelDrop | Action::LabelKeep)
            && (!config.source_labels.is_empty() || config.target_label.is_some())
        {
            return Err(error(
                "source_labels",
                "labeldrop and labelkeep match label names with `regex` and take no \
                 source_labels or target_label"
                    .into(),
            ));
        }
        for name in &config.source_labels {
            if !valid_label_name(name) {
                return Err(error(
                    "source_labels",
                    format!("{name:?} is not a valid label name"),
                ));
            }
        }
        Ok(Rule {
            index,
            source_labels: config.source_labels.clone(),
            separator: config.separator.clone().unwrap_or_else(|| ";".to_owned()),
            regex,
            modulus,
            target_label,
            replacement: config
                .replacement
                .clone()
                .unwrap_or_else(|| "$1".to_owned()),
            action,
        })
    }

    /// Applies the rule; `false` when the labels are dropped.
    fn apply(&self, labels: &mut Labels, invalid: &mut Vec<InvalidLabel>) -> bool {
        let value = || {
            self.source_labels
                .iter()
                .map(|name| labels.get(name).map_or("", String::as_str))
                .collect::<Vec<_>>()
                .join(&self.separator)
        };
        let mut set = |labels: &mut Labels, name: String, value: String| {
            let bytes = name.len().max(value.len());
            if bytes > MAX_LABEL_BYTES {
                invalid.push(InvalidLabel {
                    rule: self.index,
                    name: shortened(&name),
                    problem: LabelProblem::TooLong { bytes },
                });
            } else if !valid_label_name(&name) {
                invalid.push(InvalidLabel {
                    rule: self.index,
                    name,
                    problem: LabelProblem::Name,
                });
            } else if value.is_empty() {
                labels.remove(&name);
            } else {
                labels.insert(name, value);
            }
        };
        match self.action {
            Action::Keep => self.regex.is_match(&value()),
            Action::Drop => !self.regex.is_match(&value()),
            Action::Replace => {
                let value = value();
                let Some(captures) = self.regex.captures(&value) else {
                    return true;
                };
                let mut target = String::new();
                captures.expand(&self.target_label, &mut target);
                let mut replacement = String::new();
                captures.expand(&self.replacement, &mut replacement);
                set(labels, target, replacement);
                true
            }
            Action::Lowercase => {
                set(labels, self.target_label.clone(), value().to_lowercase());
                true
            }
            Action::Uppercase => {
                set(labels, self.target_label.clone(), value().to_uppercase());
                true
            }
            Action::HashMod => {
                // Prometheus: the last 8 bytes of the MD5 of the value, big-endian, mod N.
                let digest = Md5::digest(value().as_bytes());
                let mut tail = [0u8; 8];
                tail.copy_from_slice(&digest[8..]);
                let hash = u64::from_be_bytes(tail) % self.modulus;
                set(labels, self.target_label.clone(), hash.to_string());
                true
            }
            Action::LabelMap => {
                let mapped: Vec<(String, String)> = labels
                    .iter()
                    .filter_map(|(name, value)| {
                        let captures = self.regex.captures(name)?;
                        let mut target = String::new();
                        captures.expand(&self.replacement, &mut target);
                        Some((target, value.clone()))
                    })
                    .collect();
                for (name, value) in mapped {
                    set(labels, name, value);
                }
                true
            }
            Action::LabelDrop => {
                labels.retain(|name, _| !self.regex.is_match(name));
                true
            }
            Action::LabelKeep => {
                labels.retain(|name, _| self.regex.is_match(name));
                true
            }
        }
    }
}

/// Checks every rule of the config.
pub fn compile(configs: &[RuleConfig]) -> Result<Vec<Rule>, RelabelError> {
    configs
        .iter()
        .enumerate()
        .map(|(i, config)| Rule::new(i + 1, config))
        .collect()
}

/// What relabelling made of a process's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The series' labels: `__`-prefixed ones (discovery's `__meta_*`) removed.
    Keep(Labels),
    /// A `keep` or `drop` rule (numbered) dropped the process.
    Dropped { rule: usize },
}

/// Applies `rules` in order, then removes the labels whose names start with `__`. Labels a rule
/// tried to create with invalid names, or over [`MAX_LABEL_BYTES`], are reported in `invalid`
/// and not set.
pub fn relabel(labels: Labels, rules: &[Rule], invalid: &mut Vec<InvalidLabel>) -> Outcome {
    relabel_skipping(labels, rules, &[], invalid)
}

/// Which of `rules` depend on the labels named `sources`: a rule that reads one of them (its
/// `source_labels`; for `labelmap`, a name its regex matches), or reads a label that an
/// earlier dependent rule wrote. A dependent rule whose target is built from captures
/// (`target_label = "$1"`) could write any label, and makes every later rule that reads a
/// label dependent. `labeldrop` and `labelkeep` only remove labels, the same whatever the
/// values, and are never dependent.
///
/// The daemon decides per process, with the thread's labels (`__meta_thread`) absent, and
/// per thread after: with the dependent `keep` and `drop` rules skipped
/// ([`relabel_skipping`]), every label that a rule reading no thread label sees has the
/// value it has for every thread of the process, so a process that such a rule drops is
/// dropped for all its threads, and the deny list stays exact.
pub fn dependent_rules(rules: &[Rule], sources: &[&str]) -> Vec<bool> {
    let mut tainted: std::collections::BTreeSet<String> =
        sources.iter().map(|&name| name.to_owned()).collect();
    let mut all_tainted = false;
    rules
        .iter()
        .map(|rule| {
            let reads = match rule.action {
                Action::LabelDrop | Action::LabelKeep => false,
                Action::LabelMap => all_tainted || tainted.iter().any(|n| rule.regex.is_match(n)),
                _ => all_tainted || rule.source_labels.iter().any(|name| tainted.contains(name)),
            };
            if !reads {
                return false;
            }
            match rule.action {
                Action::Replace if rule.target_label.contains('$') => all_tainted = true,
                Action::Replace | Action::Lowercase | Action::Uppercase | Action::HashMod => {
                    tainted.insert(rule.target_label.clone());
                }
                Action::LabelMap => {
                    let mapped: Vec<String> = tainted
                        .iter()
                        .filter_map(|name| {
                            let captures = rule.regex.captures(name)?;
                            let mut target = String::new();
                            captures.expand(&rule.replacement, &mut target);
                            Some(target)
                        })
                        .collect();
                    tainted.extend(mapped);
                }
                Action::Keep | Action::Drop | Action::LabelDrop | Action::LabelKeep => {}
            }
            true
        })
        .collect()
}

/// [`relabel`], with the `keep` and `drop` rules that `skip` marks (by position) passed over:
/// the per-process decision when rules read a thread's labels (see [`dependent_rules`]).
/// Every other rule applies as usual.
pub fn relabel_skipping(
    mut labels: Labels,
    rules: &[Rule],
    skip: &[bool],
    invalid: &mut Vec<InvalidLabel>,
) -> Outcome {
    for (i, rule) in rules.iter().enumerate() {
        let skipped = skip.get(i).copied().unwrap_or(false)
            && matches!(rule.action, Action::Keep | Action::Drop);
        if !skipped && !rule.apply(&mut labels, invalid) {
            return Outcome::Dropped { rule: rule.index };
        }
    }
    labels.retain(|name, value| !name.starts_with("__") && !value.is_empty());
    Outcome::Keep(labels)
}

/// Every character a label name may not hold replaced by `_`, as Prometheus's service
/// discovery writes Kubernetes label names (`app.kubernetes.io/name` ->
/// `app_kubernetes_io_name`). A leading digit is left to the caller (a prefix fixes it).
pub fn sanitize_label_chars(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Prometheus's label name rule, which Pyroscope and Parca share.
pub fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// What [`fuzz_one`] reads: `[[relabel]]` tables as in the config file, and the labels to
/// apply them to (`[labels]`; a process's usual discovered labels when absent).
#[derive(Debug, Deserialize)]
struct FuzzInput {
    #[serde(default)]
    relabel: Vec<RuleConfig>,
    labels: Option<Labels>,
}

/// Reads arbitrary bytes as a TOML config of `[[relabel]]` rules (and optionally `[labels]`),
/// compiles them and relabels a label set with them: once, then again with the labels the
/// first pass kept, as a process would be relabelled on the next start. Must never panic nor
/// cost more time or memory than the input's size warrants: `fuzz/` calls it and
/// `agent/tests/fuzz-regressions/relabel/` keeps what it found.
pub fn fuzz_one(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(input) = toml::from_str::<FuzzInput>(text) else {
        return;
    };
    let Ok(rules) = compile(&input.relabel) else {
        return;
    };
    let labels = input.labels.unwrap_or_else(|| {
        [
            ("__meta_process_comm", "nginx"),
            ("__meta_process_pid", "4242"),
            ("__meta_process_executable", "/usr/sbin/nginx"),
            ("__meta_process_cgroup", "/system.slice/nginx.service"),
            ("__meta_kubernetes_pod_label_app_kubernetes_io_name", "shop"),
            ("comm", "nginx"),
            ("pid", "4242"),
            ("node", "node-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    });
    let mut invalid = Vec::new();
    // The deny list's promise: a process dropped with its thread's labels absent and the
    // rules reading them skipped is dropped for every thread.
    let mut process = labels.clone();
    process.remove("__meta_thread");
    let dependent = dependent_rules(&rules, &["__meta_thread"]);
    if let Outcome::Dropped { rule } = relabel_skipping(process, &rules, &dependent, &mut invalid) {
        for thread in ["worker", "(other threads)"] {
            let mut labels = labels.clone();
            labels.insert("__meta_thread".to_owned(), thread.to_owned());
            let outcome = relabel(labels, &rules, &mut invalid);
            assert!(
                matches!(outcome, Outcome::Dropped { .. }),
                "dropped by rule {rule} per process, kept for thread {thread:?}: {outcome:?}"
            );
        }
    }
    if let Outcome::Keep(kept) = relabel(labels, &rules, &mut invalid) {
        assert!(
            kept.iter()
                .all(|(name, value)| !name.starts_with("__") && !value.is_empty()),
            "{kept:?}"
        );
        let _ = relabel(kept, &rules, &mut invalid);
    }
    for label in &invalid {
        let _ = label.to_string();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::parse::selector::labels;

    fn rule(toml_text: &str) -> RuleConfig {
        toml::from_str(toml_text).unwrap()
    }

    fn run(rules: &[&str], input: &[(&str, &str)]) -> Outcome {
        let configs: Vec<RuleConfig> = rules.iter().map(|r| rule(r)).collect();
        let rules = compile(&configs).unwrap();
        let mut invalid = Vec::new();
        let outcome = relabel(labels(input), &rules, &mut invalid);
        assert!(invalid.is_empty(), "{invalid:?}");
        outcome
    }

    /// Cases and outcomes as Prometheus's relabel tests (model/relabel) give them.
    #[test]
    fn behaves_like_prometheus() {
        const INPUT: &[(&str, &str)] = &[("a", "foo"), ("b", "bar"), ("c", "baz")];
        // (what it shows, the rule, its input, the labels kept or None for dropped)
        type Case = (
            &'static str,
            &'static str,
            &'static [(&'static str, &'static str)],
            Option<&'static [(&'static str, &'static str)]>,
        );
        let cases: &[Case] = &[
            (
                "replace with capture groups and a separator",
                r#"source_labels = ["a", "b"]
                   regex = "f(.*);(.*)r"
                   target_label = "a"
                   separator = ";"
                   replacement = "ch${1}-ch${2}"
                   action = "replace""#,
                INPUT,
                Some(&[("a", "choo-chba"), ("b", "bar"), ("c", "baz")]),
            ),
            (
                "no match leaves all unchanged: the regex is anchored, \"o\" misses \"foo\"",
                r#"source_labels = ["a"]
                   regex = "o"
                   target_label = "d"
                   replacement = "x""#,
                INPUT,
                Some(INPUT),
            ),
            (
                "an empty replacement removes the target",
                r#"source_labels = ["a"]
                   regex = "foo"
                   target_label = "b"
                   replacement = """#,
                INPUT,
                Some(&[("a", "foo"), ("c", "baz")]),
            ),
            (
                "a target named from a capture group",
                r#"source_labels = ["a"]
                   regex = "f(.*)"
                   target_label = "x_${1}"
                   replacement = "y""#,
                INPUT,
                Some(&[("a", "foo"), ("b", "bar"), ("c", "baz"), ("x_oo", "y")]),
            ),
            (
                "keep",
                r#"source_labels = ["a"]
                   regex = "f.*"
                   action = "keep""#,
                INPUT,
                Some(INPUT),
            ),
            (
                "drop",
                r#"source_labels = ["a"]
                   regex = "f.*"
                   action = "drop""#,
                INPUT,
                None,
            ),
            (
                "a missing source label reads as empty: keep of \"\" on it keeps",
                r#"source_labels = ["missing"]
                   regex = ""
                   action = "keep""#,
                INPUT,
                Some(INPUT),
            ),
            (
                "labelmap",
                r#"regex = "__meta_kubernetes_pod_label_(.+)"
                   action = "labelmap""#,
                &[("__meta_kubernetes_pod_label_app", "shop"), ("pod", "p1")],
                Some(&[("app", "shop"), ("pod", "p1")]),
            ),
            (
                "labeldrop",
                r#"regex = "b|c"
                   action = "labeldrop""#,
                INPUT,
                Some(&[("a", "foo")]),
            ),
            (
                "labelkeep",
                r#"regex = "b|c"
                   action = "labelkeep""#,
                INPUT,
                Some(&[("b", "bar"), ("c", "baz")]),
            ),
            (
                "uppercase",
                r#"source_labels = ["a"]
                   target_label = "up"
                   action = "uppercase""#,
                &[("a", "Foo")],
                Some(&[("a", "Foo"), ("up", "FOO")]),
            ),
            (
                "lowercase",
                r#"source_labels = ["a"]
                   target_label = "a"
                   action = "lowercase""#,
                &[("a", "Foo")],
                Some(&[("a", "foo")]),
            ),
            (
                "default action replace, regex (.*) and replacement $1: a copy",
                r#"source_labels = ["__meta_x"]
                   target_label = "x""#,
                &[("__meta_x", "1")],
                Some(&[("x", "1")]),
            ),
        ];
        for (what, rule, input, kept) in cases {
            let expected = match kept {
                Some(kept) => Outcome::Keep(labels(kept)),
                None => Outcome::Dropped { rule: 1 },
            };
            assert_eq!(run(&[rule], input), expected, "{what}");
        }
        // hashmod: the tail of the MD5, big-endian, modulo.
        let hashed = run(
            &[r#"source_labels = ["c"]
                 target_label = "d"
                 modulus = 1000
                 action = "hashmod""#],
            INPUT,
        );
        let Outcome::Keep(out) = hashed else {
            panic!("dropped")
        };
        let digest = Md5::digest(b"baz");
        let expected = u64::from_be_bytes(digest[8..].try_into().unwrap()) % 1000;
        assert_eq!(out.get("d"), Some(&expected.to_string()));
    }

    #[test]
    fn bad_rules_name_the_rule_and_field() {
        let err = |text: &str| {
            compile(&[RuleConfig::default(), rule(text)])
                .unwrap_err()
                .to_string()
        };
        let configs_ok = RuleConfig {
            source_labels: vec!["a".into()],
            target_label: Some("b".into()),
            ..RuleConfig::default()
        };
        assert!(compile(&[configs_ok]).is_ok());
        // The first (default) rule lacks a target, so use one that is fine first.
        let message = compile(&[rule(
            r#"regex = "("
               target_label = "x""#,
        )])
        .unwrap_err()
        .to_string();
        assert!(
            message.starts_with("relabel rule 1: field `regex`"),
            "{message}"
        );
        let message = compile(&[rule(r#"action = "explode""#)])
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with("relabel rule 1: field `action`: unknown action"),
            "{message}"
        );
        // A replace without a target (the default action) names the rule's position.
        assert!(err(r#"action = "keep""#).starts_with("relabel rule 1: field `target_label`"));
        assert!(compile(&[rule(r#"action = "keep""#)]).is_ok());
        let message = compile(&[rule(
            r#"action = "hashmod"
               target_label = "h""#,
        )])
        .unwrap_err()
        .to_string();
        assert!(message.contains("field `modulus`"), "{message}");
        let message = compile(&[rule(r#"target_label = "not-valid""#)])
            .unwrap_err()
            .to_string();
        assert!(message.contains("not a valid label name"), "{message}");
    }

    #[test]
    fn a_regex_cannot_close_its_anchors() {
        // `^(?:a)|(b)$` would keep every value starting with `a`.
        let message = compile(&[rule(
            r#"regex = "a)|(b"
               action = "keep""#,
        )])
        .unwrap_err()
        .to_string();
        assert!(
            message.starts_with("relabel rule 1: field `regex`: \"a)|(b\""),
            "{message}"
        );
        assert!(message.contains("unopened group"), "{message}");
    }

    #[test]
    fn a_regex_too_large_to_compile_is_refused() {
        let message = compile(&[rule(
            r#"regex = '\pL{1000}'
               action = "keep""#,
        )])
        .unwrap_err()
        .to_string();
        assert!(message.contains("field `regex`"), "{message}");
        assert!(message.contains("size limit"), "{message}");
    }

    fn compiled(rules: &[&str]) -> Vec<Rule> {
        let configs: Vec<RuleConfig> = rules.iter().map(|r| rule(r)).collect();
        compile(&configs).unwrap()
    }

    /// A rule depends on a thread's label when it reads it, or reads what a dependent rule
    /// wrote; removing labels by name never does.
    #[test]
    fn dependent_rules_follow_what_the_thread_label_feeds() {
        let rules = compiled(&[
            // 1: the process's name only.
            r#"source_labels = ["__meta_process_comm"]
               regex = "java"
               action = "keep""#,
            // 2: the thread's name into `pool`.
            r#"source_labels = ["__meta_thread"]
               regex = "(gc|jit).*"
               target_label = "pool"
               replacement = "$1""#,
            // 3: reads `pool`, which 2 wrote from the thread's name.
            r#"source_labels = ["pool"]
               regex = "gc"
               action = "drop""#,
            // 4: the process again.
            r#"source_labels = ["comm"]
               regex = "java"
               action = "keep""#,
            // 5: every meta label mapped, the thread's among them.
            r#"regex = "__meta_(thread|node)"
               replacement = "m_$1"
               action = "labelmap""#,
            // 6: reads the thread's name as 5 mapped it.
            r#"source_labels = ["m_thread"]
               regex = "main"
               action = "keep""#,
            // 7: reads what 5 mapped from the node, not the thread.
            r#"source_labels = ["m_node"]
               regex = "n1"
               action = "keep""#,
            // 8: never: removes by name.
            r#"regex = "__meta_thread"
               action = "labeldrop""#,
            // 9: a target named by the thread: any label may now hold it.
            r#"source_labels = ["__meta_thread"]
               regex = "(.+)"
               target_label = "$1""#,
            // 10: the process's name, but after 9 it may have been overwritten.
            r#"source_labels = ["comm"]
               regex = "java"
               action = "keep""#,
        ]);
        assert_eq!(
            dependent_rules(&rules, &["__meta_thread", "__meta_thread_id"]),
            [false, true, true, false, true, true, false, false, true, true]
        );
        assert!(dependent_rules(&rules, &[]).iter().all(|&d| !d));
    }

    /// Per process, with the thread's label absent: the rules reading it are passed over,
    /// the others still drop; per thread, all apply.
    #[test]
    fn a_process_is_dropped_only_by_rules_that_read_no_thread() {
        let rules = compiled(&[
            r#"source_labels = ["__meta_thread"]
               regex = "spin"
               action = "drop""#,
            r#"source_labels = ["__meta_process_comm"]
               regex = "app"
               action = "keep""#,
        ]);
        let dependent = dependent_rules(&rules, &["__meta_thread"]);
        let mut invalid = Vec::new();
        let process = |comm: &str| labels(&[("__meta_process_comm", comm), ("comm", comm)]);
        let thread = |comm: &str, name: &str| {
            let mut labels = process(comm);
            labels.insert("__meta_thread".into(), name.into());
            labels
        };
        // Per process: the thread rule skipped, so an `app` process is kept...
        assert_eq!(
            relabel_skipping(process("app"), &rules, &dependent, &mut invalid),
            Outcome::Keep(labels(&[("comm", "app")]))
        );
        // ... and another process dropped by rule 2, for all its threads.
        assert_eq!(
            relabel_skipping(process("other"), &rules, &dependent, &mut invalid),
            Outcome::Dropped { rule: 2 }
        );
        // Per thread every rule applies: the spinning thread is dropped, the sleeping kept.
        assert_eq!(
            relabel(thread("app", "spin"), &rules, &mut invalid),
            Outcome::Dropped { rule: 1 }
        );
        assert_eq!(
            relabel(thread("app", "sleep"), &rules, &mut invalid),
            Outcome::Keep(labels(&[("comm", "app")]))
        );
        assert!(invalid.is_empty(), "{invalid:?}");
    }

    #[test]
    fn invalid_names_from_captures_are_reported_with_their_rule() {
        let rules = compile(&[rule(
            r#"source_labels = ["a"]
               regex = "(.*)"
               target_label = "${1}""#,
        )])
        .unwrap();
        let mut invalid = Vec::new();
        let outcome = relabel(labels(&[("a", "has-dash")]), &rules, &mut invalid);
        assert_eq!(outcome, Outcome::Keep(labels(&[("a", "has-dash")])));
        assert_eq!(
            invalid,
            vec![InvalidLabel {
                rule: 1,
                name: "has-dash".into(),
                problem: LabelProblem::Name,
            }]
        );
    }

    #[test]
    fn rules_doubling_a_value_stop_at_the_length_cap() {
        // Forty rules, each setting `comm` to its value twice over: without the cap, 5 TiB.
        let doubling: Vec<RuleConfig> = (0..40)
            .map(|_| {
                rule(
                    r#"source_labels = ["comm"]
                       target_label = "comm"
                       replacement = "$1$1""#,
                )
            })
            .collect();
        let rules = compile(&doubling).unwrap();
        let mut invalid = Vec::new();
        let Outcome::Keep(out) = relabel(labels(&[("comm", "nginx")]), &rules, &mut invalid) else {
            panic!("dropped")
        };
        // 5 bytes doubled 11 times is 10240, under the cap; the 12th would be 20480.
        assert_eq!(out["comm"].len(), 5 << 11);
        assert_eq!(invalid.len(), 40 - 11);
        assert_eq!(
            invalid[0],
            InvalidLabel {
                rule: 12,
                name: "comm".into(),
                problem: LabelProblem::TooLong { bytes: 5 << 12 },
            }
        );
        assert_eq!(
            invalid[0].to_string(),
            "relabel rule 12 produced a label name or value of 20480 bytes (label \"comm\"), \
             more than the 16384 allowed; the label was not set"
        );
        // A name built the same way is cut short in the report.
        let rules = compile(&[rule(
            r#"source_labels = ["comm"]
               regex = "(.*)"
               target_label = "${1}${1}${1}${1}"
               replacement = "x""#,
        )])
        .unwrap();
        let mut invalid = Vec::new();
        let long = "a".repeat(5000);
        relabel(labels(&[("comm", &long)]), &rules, &mut invalid);
        assert_eq!(invalid[0].problem, LabelProblem::TooLong { bytes: 20000 });
        assert_eq!(invalid[0].name, format!("{}...", "a".repeat(64)));
    }

    #[test]
    fn fuzz_regressions_do_not_panic() {
        let inputs = crate::sys::fs::fuzz_inputs("relabel");
        assert!(!inputs.is_empty(), "fuzz/seeds/relabel/ is committed");
        for (path, data) in &inputs {
            eprintln!("{}", path.display());
            fuzz_one(data);
        }
    }
}
