//! Label selectors in Prometheus syntax, `{comm="nginx", pid!="3", unit=~"ssh.*"}`: how
//! `scorch query --match` and the HTTP API's `match=` pick the series whose windows they merge.
//!
//! The semantics are Prometheus's, so that a selector a user already knows does what they
//! expect: regexes match the whole value (`=~"ssh"` does not match `sshd`), and a label a
//! series lacks reads as the empty string (`{container=""}` selects series without one).

use std::{fmt, str::FromStr};

use regex::{Regex, RegexBuilder};

/// Selectors come from anyone who can reach the HTTP API, and each regex is compiled and run
/// against every series: these bounds keep one request from costing seconds and hundreds of
/// MiB (60 matchers of `\w{150}` once did). Real selectors are a few matchers of a few dozen
/// bytes.
pub const MAX_SELECTOR_BYTES: usize = 4096;
/// Matchers in one selector.
pub const MAX_MATCHERS: usize = 32;
/// Compiled size of one regex (the `regex` crate's own measure; its default is 10 MiB).
pub const MAX_REGEX_BYTES: usize = 256 << 10;
/// The lazy DFA's cache per regex.
const MAX_REGEX_DFA_BYTES: usize = 512 << 10;

/// `pattern` compiled to match whole values only, as `^(?FLAGS:pattern)$`, within the given
/// compiled and lazy-DFA sizes. A pattern that is not a regex by itself is refused although
/// the anchored text may compile: `a)|(b` would make `^(?:a)|(b)$`, which matches any value
/// that starts with `a` or ends with `b`. Relabel rules anchor their patterns the same way.
pub fn whole_value_regex(
    pattern: &str,
    flags: &str,
    size_limit: usize,
    dfa_size_limit: usize,
) -> Result<Regex, regex::Error> {
    let ast = regex_syntax::ast::parse::Parser::new()
        .parse(pattern)
        .map_err(|e| regex::Error::Syntax(e.to_string()))?;
    let pattern = ascii_perl_classes(pattern, &ast);
    RegexBuilder::new(&format!("^(?{flags}:{pattern})$"))
        .size_limit(size_limit)
        .dfa_size_limit(dfa_size_limit)
        .build()
}

/// `pattern` with `\\d`, `\\s`, `\\w` and their negations spelled as the ASCII classes they
/// are in Prometheus (Go's RE2), instead of the `regex` crate's Unicode classes. Besides
/// matching what Prometheus matches, this keeps ordinary patterns small: Unicode `\\w{15}`
/// compiles past [`MAX_REGEX_BYTES`], the ASCII class 150 times over does not. The
/// replacement is a bracketed class, which the `regex` crate also accepts nested inside a
/// class (`[a\\w]` becomes `[a[0-9A-Za-z_]]`).
fn ascii_perl_classes(pattern: &str, ast: &regex_syntax::ast::Ast) -> String {
    use regex_syntax::ast::{visit, Ast, ClassPerl, ClassPerlKind, ClassSetItem, Visitor};

    struct Perl(Vec<(usize, usize, &'static str)>);
    impl Perl {
        fn add(&mut self, class: &ClassPerl) {
            let ascii = match (&class.kind, class.negated) {
                (ClassPerlKind::Digit, false) => "[0-9]",
                (ClassPerlKind::Digit, true) => "[^0-9]",
                (ClassPerlKind::Space, false) => r"[\t\n\f\r ]",
                (ClassPerlKind::Space, true) => r"[^\t\n\f\r ]",
                (ClassPerlKind::Word, false) => "[0-9A-Za-z_]",
                (ClassPerlKind::Word, true) => "[^0-9A-Za-z_]",
            };
            self.0
                .push((class.span.start.offset, class.span.end.offset, ascii));
        }
    }
    impl Visitor for Perl {
        type Output = Vec<(usize, usize, &'static str)>;
        type Err = std::convert::Infallible;
        fn finish(self) -> Result<Self::Output, Self::Err> {
            Ok(self.0)
        }
        fn visit_pre(&mut self, ast: &Ast) -> Result<(), Self::Err> {
            if let Ast::ClassPerl(class) = ast {
                self.add(class);
            }
            Ok(())
        }
        fn visit_class_set_item_pre(&mut self, item: &ClassSetItem) -> Result<(), Self::Err> {
            if let ClassSetItem::Perl(class) = item {
                self.add(class);
            }
            Ok(())
        }
    }
    let Ok(mut spans) = visit(ast, Perl(Vec::new()));
    spans.sort_unstable();
    let mut out = String::with_capacity(pattern.len());
    let mut at = 0;
    for (start, end, ascii) in spans {
        out.push_str(&pattern[at..start]);
        out.push_str(ascii);
        at = end;
    }
    out.push_str(&pattern[at..]);
    out
}

/// Labels as a selector sees them: names to values, sorted by name (the profile model's
/// `Labels`, named here so this parser depends on nothing of the crate).
pub type Labels = std::collections::BTreeMap<String, String>;

/// Labels from `(name, value)` pairs: tests across the crate write label sets this way.
#[cfg(test)]
pub(crate) fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A malformed selector: the input, where it went wrong and what was expected there.
#[derive(Debug, thiserror::Error)]
pub enum SelectorError {
    #[error("label selector {input:?}: at byte {position}: {problem}")]
    Syntax {
        input: String,
        /// Byte offset into `input` where parsing stopped.
        position: usize,
        problem: String,
    },
    #[error("label selector of {length} bytes: longer than the {MAX_SELECTOR_BYTES} allowed")]
    TooLong { length: usize },
    /// Short enough as written, but not in the canonical form it prints as (escapes such as
    /// `\n` take two bytes for one): refused, so that every selector that parses prints as
    /// one that parses again.
    #[error(
        "label selector of {length} bytes when written out with escapes: longer than the \
         {MAX_SELECTOR_BYTES} allowed"
    )]
    CanonicalTooLong { length: usize },
    #[error("label selector {input:?}: more than {MAX_MATCHERS} matchers")]
    TooManyMatchers { input: String },
    #[error("label selector {input:?}: label {label}: invalid regex {pattern:?}: {source}")]
    Regex {
        input: String,
        label: String,
        pattern: String,
        source: Box<regex::Error>,
    },
}

/// How a matcher compares a label's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    /// `=`
    Equal,
    /// `!=`
    NotEqual,
    /// `=~`
    Regex,
    /// `!~`
    NotRegex,
}

impl MatchOp {
    fn as_str(self) -> &'static str {
        match self {
            MatchOp::Equal => "=",
            MatchOp::NotEqual => "!=",
            MatchOp::Regex => "=~",
            MatchOp::NotRegex => "!~",
        }
    }
}

/// One `name op "value"` term.
#[derive(Debug, Clone)]
pub struct Matcher {
    pub name: String,
    pub op: MatchOp,
    /// The value as written (unescaped); for regex operators, the pattern before anchoring.
    pub value: String,
    /// The anchored pattern, compiled once at parse time, for `=~` and `!~`.
    regex: Option<Regex>,
}

impl Matcher {
    /// Builds a matcher, compiling and anchoring the pattern of a regex operator.
    pub fn new(name: &str, op: MatchOp, value: &str) -> Result<Matcher, regex::Error> {
        let regex = match op {
            // Prometheus anchors at both ends and lets `.` match newlines.
            MatchOp::Regex | MatchOp::NotRegex => Some(whole_value_regex(
                value,
                "s",
                MAX_REGEX_BYTES,
                MAX_REGEX_DFA_BYTES,
            )?),
            MatchOp::Equal | MatchOp::NotEqual => None,
        };
        Ok(Matcher {
            name: name.to_owned(),
            op,
            value: value.to_owned(),
            regex,
        })
    }

    /// Whether the label set satisfies this term; a missing label reads as "".
    pub fn matches(&self, labels: &Labels) -> bool {
        let value = labels.get(&self.name).map_or("", String::as_str);
        match (self.op, &self.regex) {
            (MatchOp::Equal, _) => value == self.value,
            (MatchOp::NotEqual, _) => value != self.value,
            (MatchOp::Regex, Some(regex)) => regex.is_match(value),
            (MatchOp::NotRegex, Some(regex)) => !regex.is_match(value),
            // `new` compiles a regex for both regex operators.
            (MatchOp::Regex | MatchOp::NotRegex, None) => false,
        }
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}\"", self.name, self.op.as_str())?;
        for c in self.value.chars() {
            match c {
                '"' => write!(f, "\\\"")?,
                '\\' => write!(f, "\\\\")?,
                '\n' => write!(f, "\\n")?,
                c => write!(f, "{c}")?,
            }
        }
        write!(f, "\"")
    }
}

/// A conjunction of matchers; the empty selector matches every series.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    matchers: Vec<Matcher>,
}

impl Selector {
    /// The selector that matches everything (`{}`).
    pub fn all() -> Selector {
        Selector::default()
    }

    /// Parses `{a="x", b!~"y|z"}`; the braces are optional, a trailing comma is allowed, and
    /// blank input or `{}` matches everything. Values take double quotes, single quotes (both
    /// with backslash escapes) or backticks (raw), as in PromQL.
    ///
    /// Input longer than [`MAX_SELECTOR_BYTES`] (as written, or in the canonical form it
    /// prints as), more than [`MAX_MATCHERS`] matchers, or a regex that compiles beyond
    /// [`MAX_REGEX_BYTES`] is refused before any matching.
    pub fn parse(input: &str) -> Result<Selector, SelectorError> {
        if input.len() > MAX_SELECTOR_BYTES {
            return Err(SelectorError::TooLong {
                length: input.len(),
            });
        }
        let selector = Parser { input, position: 0 }.selector()?;
        let length = selector.to_string().len();
        if length > MAX_SELECTOR_BYTES {
            return Err(SelectorError::CanonicalTooLong { length });
        }
        Ok(selector)
    }

    /// Whether a series with `labels` is selected: every matcher must accept it.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.matchers.iter().all(|m| m.matches(labels))
    }

    pub fn matchers(&self) -> &[Matcher] {
        &self.matchers
    }

    /// True for the selector that matches everything.
    pub fn is_empty(&self) -> bool {
        self.matchers.is_empty()
    }
}

impl FromStr for Selector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Selector, SelectorError> {
        Selector::parse(s)
    }
}

impl fmt::Display for Selector {
    /// The canonical form, `{a="x", b=~"y"}`, which parses back to the same selector.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{")?;
        for (i, matcher) in self.matchers.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{matcher}")?;
        }
        write!(f, "}}")
    }
}

/// A recursive-descent parser over the input's bytes; `position` is where the next token starts.
struct Parser<'a> {
    input: &'a str,
    position: usize,
}

impl Parser<'_> {
    fn selector(mut self) -> Result<Selector, SelectorError> {
        self.skip_space();
        let braced = self.eat('{');
        let mut matchers = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                None if braced => return Err(self.error("missing closing '}'")),
                None => break,
                Some('}') if braced => {
                    self.position += 1;
                    break;
                }
                Some(_) => {}
            }
            if matchers.len() == MAX_MATCHERS {
                return Err(SelectorError::TooManyMatchers {
                    input: self.input.to_owned(),
                });
            }
            matchers.push(self.matcher()?);
            self.skip_space();
            match self.peek() {
                Some(',') => self.position += 1,
                Some('}') if braced => {}
                None if !braced => {}
                Some(c) => return Err(self.error(&format!("expected ',' or '}}' but found {c:?}"))),
                None => return Err(self.error("missing closing '}'")),
            }
        }
        self.skip_space();
        if let Some(c) = self.peek() {
            return Err(self.error(&format!("unexpected {c:?} after the closing '}}'")));
        }
        Ok(Selector { matchers })
    }

    fn matcher(&mut self) -> Result<Matcher, SelectorError> {
        let name = self.label_name()?;
        self.skip_space();
        let op = self.operator()?;
        self.skip_space();
        let value = self.string()?;
        Matcher::new(&name, op, &value).map_err(|source| SelectorError::Regex {
            input: self.input.to_owned(),
            label: name,
            pattern: value,
            source: Box::new(source),
        })
    }

    /// `[a-zA-Z_][a-zA-Z0-9_]*`, Prometheus's label name syntax.
    fn label_name(&mut self) -> Result<String, SelectorError> {
        let start = self.position;
        let rest = &self.input[start..];
        let length = rest
            .char_indices()
            .find(|&(i, c)| !(c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit())))
            .map_or(rest.len(), |(i, _)| i);
        if length == 0 {
            return Err(match self.peek() {
                Some(c) => self.error(&format!("expected a label name but found {c:?}")),
                None => self.error("expected a label name"),
            });
        }
        self.position += length;
        Ok(rest[..length].to_owned())
    }

    fn operator(&mut self) -> Result<MatchOp, SelectorError> {
        let rest = &self.input[self.position..];
        // Two-character operators first, so `=~` is not read as `=` followed by `~`.
        let (op, length) = if rest.starts_with("=~") {
            (MatchOp::Regex, 2)
        } else if rest.starts_with("!~") {
            (MatchOp::NotRegex, 2)
        } else if rest.starts_with("!=") {
            (MatchOp::NotEqual, 2)
        } else if rest.starts_with('=') {
            (MatchOp::Equal, 1)
        } else {
            return Err(self.error("expected one of =, !=, =~, !~"));
        };
        self.position += length;
        Ok(op)
    }

    fn string(&mut self) -> Result<String, SelectorError> {
        let start = self.position;
        let quote = match self.peek() {
            Some(q @ ('"' | '\'' | '`')) => q,
            Some(c) => return Err(self.error(&format!("expected a quoted value but found {c:?}"))),
            None => return Err(self.error("expected a quoted value")),
        };
        self.position += 1;
        let mut value = String::new();
        let mut chars = self.input[self.position..].char_indices();
        while let Some((offset, c)) = chars.next() {
            if c == quote {
                self.position += offset + 1;
                return Ok(value);
            }
            if c == '\\' && quote != '`' {
                let Some((_, escaped)) = chars.next() else {
                    break;
                };
                value.push(match escaped {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    '\\' | '"' | '\'' => escaped,
                    other => {
                        self.position += offset;
                        return Err(self.error(&format!("unknown escape \\{other}")));
                    }
                });
                continue;
            }
            value.push(c);
        }
        self.position = start;
        Err(self.error(&format!("value opened with {quote} is never closed")))
    }

    fn peek(&self) -> Option<char> {
        self.input[self.position..].chars().next()
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.position += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn skip_space(&mut self) {
        let rest = &self.input[self.position..];
        self.position += rest.len() - rest.trim_start().len();
    }

    fn error(&self, problem: &str) -> SelectorError {
        SelectorError::Syntax {
            input: self.input.to_owned(),
            position: self.position,
            problem: problem.to_owned(),
        }
    }
}

/// Parses arbitrary bytes as a selector and, when they parse, checks what a caller relies on:
/// the canonical form ([`Selector`]'s `Display`) parses back to the same matchers and
/// prints the same again, both select the same of a few label sets, and every regex
/// operator's pattern is a regex by itself, so the anchors around it hold. Must never
/// panic: `fuzz/` calls it and `agent/tests/fuzz-regressions/selector/` keeps what it found.
pub fn fuzz_one(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(selector) = Selector::parse(text) else {
        return;
    };
    let canonical = selector.to_string();
    let again = Selector::parse(&canonical)
        .unwrap_or_else(|e| panic!("{text:?} prints as {canonical:?}, which does not parse: {e}"));
    assert_eq!(again.to_string(), canonical, "{text:?}");
    let terms = |s: &Selector| -> Vec<(String, MatchOp, String)> {
        s.matchers()
            .iter()
            .map(|m| (m.name.clone(), m.op, m.value.clone()))
            .collect()
    };
    assert_eq!(terms(&again), terms(&selector), "{text:?}");
    for matcher in selector.matchers() {
        if matches!(matcher.op, MatchOp::Regex | MatchOp::NotRegex) {
            assert!(
                Regex::new(&matcher.value).is_ok(),
                "{text:?}: pattern {:?} is no regex alone",
                matcher.value
            );
        }
    }
    // The values the selector names, and values near them, under its own label names.
    let own: Labels = selector
        .matchers()
        .iter()
        .map(|m| (m.name.clone(), m.value.clone()))
        .collect();
    let near: Labels = selector
        .matchers()
        .iter()
        .map(|m| (m.name.clone(), format!("{}x", m.value)))
        .collect();
    let other: Labels = [("comm", "nginx"), ("pid", "1"), ("empty", "")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    for labels in [Labels::new(), own, near, other] {
        assert_eq!(
            selector.matches(&labels),
            again.matches(&labels),
            "{text:?} and {canonical:?} on {labels:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(selector: &str, pairs: &[(&str, &str)]) -> bool {
        Selector::parse(selector).unwrap().matches(&labels(pairs))
    }

    #[test]
    fn parses_all_four_operators() {
        let s = Selector::parse(r#"{comm="nginx", pid!="3", unit=~"ssh.*", x!~"a|b"}"#).unwrap();
        let ops: Vec<(&str, MatchOp, &str)> = s
            .matchers()
            .iter()
            .map(|m| (m.name.as_str(), m.op, m.value.as_str()))
            .collect();
        assert_eq!(
            ops,
            [
                ("comm", MatchOp::Equal, "nginx"),
                ("pid", MatchOp::NotEqual, "3"),
                ("unit", MatchOp::Regex, "ssh.*"),
                ("x", MatchOp::NotRegex, "a|b"),
            ]
        );
    }

    #[test]
    fn braces_are_optional_and_empty_matches_everything() {
        for text in ["", "  ", "{}", "{ }", " { } "] {
            let s = Selector::parse(text).unwrap();
            assert!(s.is_empty(), "{text:?}");
            assert!(s.matches(&labels(&[("comm", "x")])));
            assert!(s.matches(&Labels::new()));
        }
        assert!(matches(r#"comm="nginx""#, &[("comm", "nginx")]));
        assert!(matches(
            r#"comm="nginx",pid="1","#,
            &[("comm", "nginx"), ("pid", "1")]
        ));
        assert!(matches(r#"{comm="nginx",}"#, &[("comm", "nginx")]));
    }

    #[test]
    fn regexes_are_anchored() {
        assert!(matches(r#"{unit=~"ssh"}"#, &[("unit", "ssh")]));
        assert!(!matches(r#"{unit=~"ssh"}"#, &[("unit", "sshd")]));
        assert!(!matches(r#"{unit=~"ssh"}"#, &[("unit", "openssh")]));
        assert!(matches(r#"{unit=~"ssh.*"}"#, &[("unit", "sshd")]));
        // The alternation stays inside the anchors: `a|b` does not mean `^a|b$`.
        assert!(!matches(r#"{x=~"a|b"}"#, &[("x", "ab")]));
        assert!(matches(r#"{x!~"a|b"}"#, &[("x", "ab")]));
        assert!(!matches(r#"{x!~"a|b"}"#, &[("x", "b")]));
        // `.` matches a newline, as in Prometheus.
        assert!(matches(r#"{x=~"a.b"}"#, &[("x", "a\nb")]));
    }

    #[test]
    fn missing_label_reads_as_empty() {
        assert!(matches(r#"{container=""}"#, &[("comm", "x")]));
        assert!(!matches(r#"{container!=""}"#, &[("comm", "x")]));
        assert!(matches(r#"{container=~".*"}"#, &[]));
        assert!(!matches(r#"{container=~".+"}"#, &[]));
        assert!(matches(r#"{container!="web"}"#, &[]));
        assert!(!matches(r#"{comm="nginx"}"#, &[]));
    }

    #[test]
    fn all_matchers_must_hold() {
        let s = r#"{comm="nginx", pid!="3"}"#;
        assert!(matches(s, &[("comm", "nginx"), ("pid", "4")]));
        assert!(!matches(s, &[("comm", "nginx"), ("pid", "3")]));
        assert!(!matches(s, &[("comm", "apache"), ("pid", "4")]));
    }

    #[test]
    fn quotes_and_escapes() {
        let s = Selector::parse(r#"{a='it\'s', b="say \"hi\"\n", c=`raw\d+`}"#).unwrap();
        let values: Vec<&str> = s.matchers().iter().map(|m| m.value.as_str()).collect();
        assert_eq!(values, ["it's", "say \"hi\"\n", r"raw\d+"]);
        assert!(matches(r#"{c=~`v\d+`}"#, &[("c", "v12")]));
        // Non-ASCII values are bytes of UTF-8, not a parse problem.
        assert!(matches(r#"{comm="café"}"#, &[("comm", "café")]));
    }

    #[test]
    fn display_round_trips() {
        let text = r#"{comm="ng\"inx", unit=~"ssh.*", x!~"a|b", pid!="3"}"#;
        let s = Selector::parse(text).unwrap();
        assert_eq!(s.to_string(), text);
        assert_eq!(Selector::parse(&s.to_string()).unwrap().to_string(), text);
        assert_eq!(Selector::all().to_string(), "{}");
    }

    fn syntax_error(text: &str) -> (usize, String) {
        match Selector::parse(text) {
            Err(SelectorError::Syntax {
                input,
                position,
                problem,
            }) => {
                assert_eq!(input, text);
                (position, problem)
            }
            other => panic!("{text:?}: expected a syntax error, got {other:?}"),
        }
    }

    #[test]
    fn errors_say_where_and_what() {
        let (position, problem) = syntax_error(r#"{comm="nginx""#);
        assert_eq!(position, 13);
        assert!(problem.contains("closing '}'"), "{problem}");

        let (position, problem) = syntax_error(r#"{comm=nginx}"#);
        assert_eq!(position, 6);
        assert!(problem.contains("quoted value"), "{problem}");

        let (position, problem) = syntax_error(r#"{comm~"x"}"#);
        assert_eq!(position, 5);
        assert!(problem.contains("=, !=, =~, !~"), "{problem}");

        let (position, problem) = syntax_error(r#"{1abc="x"}"#);
        assert_eq!(position, 1);
        assert!(problem.contains("label name"), "{problem}");

        let (position, problem) = syntax_error(r#"{comm="x" pid="1"}"#);
        assert_eq!(position, 10);
        assert!(problem.contains("expected ','"), "{problem}");

        let (position, problem) = syntax_error(r#"{comm="x}"#);
        assert_eq!(position, 6);
        assert!(problem.contains("never closed"), "{problem}");

        let (_, problem) = syntax_error(r#"{a="x"} b"#);
        assert!(problem.contains("after the closing"), "{problem}");

        let (_, problem) = syntax_error(r#"{a="\q"}"#);
        assert!(problem.contains("escape"), "{problem}");

        let message = Selector::parse(r#"{comm="x" pid="1"}"#)
            .unwrap_err()
            .to_string();
        assert!(message.contains(r#"{comm=\"x\" pid=\"1\"}"#), "{message}");
        assert!(message.contains("byte 10"), "{message}");
    }

    #[test]
    fn the_canonical_form_is_within_the_length_cap_too() {
        // 4000 newlines are 4000 bytes as written and 8000 as `\n` escapes: this once parsed
        // and printed as a selector that did not.
        let newlines = format!("a=\"{}\"", "\n".repeat(4000));
        assert!(matches!(
            Selector::parse(&newlines),
            Err(SelectorError::CanonicalTooLong { length: 8006 })
        ));
        let message = Selector::parse(&newlines).unwrap_err().to_string();
        assert!(message.contains("8006 bytes when written out"), "{message}");
        let fits = format!("a=\"{}\"", "\n".repeat(2000));
        let s = Selector::parse(&fits).unwrap();
        assert_eq!(s.to_string().len(), 4006);
        assert!(Selector::parse(&s.to_string()).is_ok());
    }

    #[test]
    fn a_pattern_cannot_close_its_anchors() {
        // `^(?s:a)|(b)$` compiles and would match "axe" and "bob": refused, like `a)|(b`
        // would be alone. The fuzzer's first finding was the shortest such pattern, `)(`.
        for text in [r#"{x=~"a)|(b"}"#, r#"{x!~")("}"#] {
            let error = Selector::parse(text).unwrap_err();
            assert!(
                matches!(error, SelectorError::Regex { ref label, .. } if label == "x"),
                "{text}: {error:?}"
            );
            assert!(error.to_string().contains("unopened group"), "{error}");
        }
        assert!(matches(r#"{x=~"(a)|(b)"}"#, &[("x", "b")]));
        assert!(!matches(r#"{x=~"(a)|(b)"}"#, &[("x", "bob")]));
    }

    #[test]
    fn bad_regex_names_the_label() {
        let error = Selector::parse(r#"{unit=~"ssh("}"#).unwrap_err();
        assert!(matches!(error, SelectorError::Regex { ref label, .. } if label == "unit"));
        let message = error.to_string();
        assert!(
            message.contains("unit") && message.contains("ssh("),
            "{message}"
        );
    }

    #[test]
    fn a_selector_bomb_is_refused_quickly() {
        // The attack: 60 matchers of a large Unicode class repeated 150 times.
        let bomb: Vec<String> = (0..60).map(|i| format!("a{i}=~\"\\\\w{{150}}\"")).collect();
        let bomb = format!("{{{}}}", bomb.join(","));
        assert!(Selector::parse(&bomb).is_err());
        let many: Vec<String> = (0..=MAX_MATCHERS).map(|i| format!("l{i}=\"x\"")).collect();
        let error = Selector::parse(&format!("{{{}}}", many.join(",")))
            .unwrap_err()
            .to_string();
        assert!(error.contains("more than 32 matchers"), "{error}");
        // One such regex alone is over the compiled-size cap (a Unicode class: `\w` is
        // ASCII, as in Prometheus).
        let error = Selector::parse(r#"{a=~`\pL{150}`}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("invalid regex"), "{error}");
        let long = format!("{{a=\"{}\"}}", "x".repeat(MAX_SELECTOR_BYTES));
        assert!(matches!(
            Selector::parse(&long),
            Err(SelectorError::TooLong { .. })
        ));
        // Ordinary regexes and up to the cap of matchers still work.
        let many: Vec<String> = (0..MAX_MATCHERS)
            .map(|i| format!("l{i}=~\"a.*|b\""))
            .collect();
        assert!(Selector::parse(&format!("{{{}}}", many.join(","))).is_ok());
        assert!(Selector::parse(r#"{comm=~`\w+`}"#).is_ok());
        assert!(Selector::parse(r#"{comm=~`\w{150}`}"#).is_ok());
        assert!(Selector::parse(r#"{comm=~`(\w{150}){50}`}"#).is_err());
    }

    #[test]
    fn perl_classes_are_ascii_as_in_prometheus() {
        for (pattern, value, expected) in [
            (r"\w+", "abc_09", true),
            (r"\w+", "é", false),
            (r"\W", "é", true),
            (r"\d+", "0123", true),
            (r"\d", "٣", false),
            (r"\D", "٣", true),
            (r"a\sb", "a b", true),
            (r"a\sb", "a\u{a0}b", false),
            (r"a\Sb", "a\u{a0}b", true),
            (r"[\w.-]+", "x.y-z", true),
            (r"[^\d]+", "abc", true),
            (r"[^\d]+", "a1", false),
            (r"\\w", r"\w", true),
            (r"[\\]w", r"\w", true),
        ] {
            let regex = whole_value_regex(pattern, "s", MAX_REGEX_BYTES, MAX_REGEX_DFA_BYTES)
                .unwrap_or_else(|e| panic!("{pattern}: {e}"));
            assert_eq!(regex.is_match(value), expected, "{pattern} on {value:?}");
        }
    }

    #[test]
    fn fuzz_regressions_do_not_panic() {
        let inputs = crate::sys::fs::fuzz_inputs("selector");
        assert!(!inputs.is_empty(), "fuzz/seeds/selector/ is committed");
        for (path, data) in &inputs {
            eprintln!("{}", path.display());
            fuzz_one(data);
        }
    }
}
