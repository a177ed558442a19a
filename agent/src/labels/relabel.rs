//! Relabelling: Prometheus `relabel_config` semantics over a process's discovered labels.
//!
//! The rules come from the config file and are checked at startup, so a bad regex or an
//! unknown action is a startup error naming the rule and the field. Applying them is pure:
//! labels in, labels out (or `None` when a `keep`/`drop` rule drops the process).

use std::fmt;

use md5::{Digest, Md5};
use regex::Regex;
use serde::Deserialize;

use crate::profile::Labels;

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
    /// Anchored like Prometheus: `^(?:regex)$`.
    regex: Regex,
    modulus: u64,
    target_label: String,
    replacement: String,
    pub action: Action,
}

/// A label a rule produced that Prometheus and Pyroscope would refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidLabel {
    pub rule: usize,
    pub name: String,
}

impl fmt::Display for InvalidLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "relabel rule {} produced the label name {:?}, which is not a valid label name \
             ([a-zA-Z_][a-zA-Z0-9_]*); the label was not set",
            self.rule, self.name
        )
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
        let regex = Regex::new(&format!("^(?:{pattern})$"))
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
            if !valid_label_name(&name) {
                invalid.push(InvalidLabel {
                    rule: self.index,
                    name,
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
/// tried to create with invalid names are reported in `invalid` and not set.
pub fn relabel(mut labels: Labels, rules: &[Rule], invalid: &mut Vec<InvalidLabel>) -> Outcome {
    for rule in rules {
        if !rule.apply(&mut labels, invalid) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

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
        let input = [("a", "foo"), ("b", "bar"), ("c", "baz")];
        // replace with capture groups and a separator.
        assert_eq!(
            run(
                &[r#"source_labels = ["a", "b"]
                     regex = "f(.*);(.*)r"
                     target_label = "a"
                     separator = ";"
                     replacement = "ch${1}-ch${2}"
                     action = "replace""#],
                &input
            ),
            Outcome::Keep(labels(&[("a", "choo-chba"), ("b", "bar"), ("c", "baz")]))
        );
        // No match: unchanged. The regex is anchored: "o" does not match "foo".
        assert_eq!(
            run(
                &[r#"source_labels = ["a"]
                     regex = "o"
                     target_label = "d"
                     replacement = "x""#],
                &input
            ),
            Outcome::Keep(labels(&input))
        );
        // An empty replacement removes the target.
        assert_eq!(
            run(
                &[r#"source_labels = ["a"]
                     regex = "foo"
                     target_label = "b"
                     replacement = """#],
                &input
            ),
            Outcome::Keep(labels(&[("a", "foo"), ("c", "baz")]))
        );
        // A target named from a capture group.
        assert_eq!(
            run(
                &[r#"source_labels = ["a"]
                     regex = "f(.*)"
                     target_label = "x_${1}"
                     replacement = "y""#],
                &input
            ),
            Outcome::Keep(labels(&[
                ("a", "foo"),
                ("b", "bar"),
                ("c", "baz"),
                ("x_oo", "y")
            ]))
        );
        // keep and drop.
        assert_eq!(
            run(
                &[r#"source_labels = ["a"]
                     regex = "f.*"
                     action = "keep""#],
                &input
            ),
            Outcome::Keep(labels(&input))
        );
        assert_eq!(
            run(
                &[r#"source_labels = ["a"]
                     regex = "f.*"
                     action = "drop""#],
                &input
            ),
            Outcome::Dropped { rule: 1 }
        );
        // A missing source label reads as empty: keep of "" on it keeps.
        assert_eq!(
            run(
                &[r#"source_labels = ["missing"]
                     regex = ""
                     action = "keep""#],
                &input
            ),
            Outcome::Keep(labels(&input))
        );
        // hashmod: the tail of the MD5, big-endian, modulo.
        let hashed = run(
            &[r#"source_labels = ["c"]
                 target_label = "d"
                 modulus = 1000
                 action = "hashmod""#],
            &input,
        );
        let Outcome::Keep(out) = hashed else {
            panic!("dropped")
        };
        let digest = Md5::digest(b"baz");
        let expected = u64::from_be_bytes(digest[8..].try_into().unwrap()) % 1000;
        assert_eq!(out.get("d"), Some(&expected.to_string()));
        // labelmap, labeldrop, labelkeep.
        assert_eq!(
            run(
                &[r#"regex = "__meta_kubernetes_pod_label_(.+)"
                     action = "labelmap""#],
                &[("__meta_kubernetes_pod_label_app", "shop"), ("pod", "p1")]
            ),
            Outcome::Keep(labels(&[("app", "shop"), ("pod", "p1")]))
        );
        assert_eq!(
            run(
                &[r#"regex = "b|c"
                     action = "labeldrop""#],
                &input
            ),
            Outcome::Keep(labels(&[("a", "foo")]))
        );
        assert_eq!(
            run(
                &[r#"regex = "b|c"
                     action = "labelkeep""#],
                &input
            ),
            Outcome::Keep(labels(&[("b", "bar"), ("c", "baz")]))
        );
        // lowercase and uppercase.
        assert_eq!(
            run(
                &[r#"source_labels = ["a"]
                     target_label = "up"
                     action = "uppercase""#],
                &[("a", "Foo")]
            ),
            Outcome::Keep(labels(&[("a", "Foo"), ("up", "FOO")]))
        );
        assert_eq!(
            run(
                &[r#"source_labels = ["a"]
                     target_label = "a"
                     action = "lowercase""#],
                &[("a", "Foo")]
            ),
            Outcome::Keep(labels(&[("a", "foo")]))
        );
        // Default action replace, default regex (.*), default replacement $1: a copy.
        assert_eq!(
            run(
                &[r#"source_labels = ["__meta_x"]
                     target_label = "x""#],
                &[("__meta_x", "1")]
            ),
            Outcome::Keep(labels(&[("x", "1")]))
        );
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
                name: "has-dash".into()
            }]
        );
    }
}
