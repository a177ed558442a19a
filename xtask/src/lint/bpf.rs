//! The BPF crate's module order, at every depth: `agent-ebpf/src/main.rs` declares the
//! top-level modules bottom-up (shared state, the architecture, the runtimes, the walk, the
//! programs), and each folder's `mod.rs` declares its files bottom-up. A file may name a
//! module only when, where its path and the file's part, the named one is declared before the
//! file's own; it may name its own descendants, never its parents (a folder's `mod.rs` sits
//! above its files). So the crate has no import circle, as it had when the sampler, the walk
//! and Python imported each other.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use super::{collect_rs_files, declared_modules, strip_comments_and_strings, strip_tests};

/// One import against the BPF crate's declared order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BpfEdge {
    pub file: PathBuf,
    pub line: usize,
    pub from: String,
    pub to: String,
    pub why: &'static str,
}

impl fmt::Display for BpfEdge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: `{}` imports `{}`, {}",
            self.file.display(),
            self.line,
            self.from,
            self.to,
            self.why
        )
    }
}

/// Every import against the order in `agent-ebpf/src`, as problems to report.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let src = root.join("agent-ebpf/src");
    let mut files = Vec::new();
    collect_rs_files(&src, &mut files)?;
    files.sort();
    let mut problems = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap_or(file);
        let module = module_path(relative);
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let code = strip_tests(&strip_comments_and_strings(&text));
        let shown = Path::new("agent-ebpf/src").join(relative);
        let order = |folder: &[String]| -> Vec<String> {
            let dir = folder.iter().fold(src.clone(), |dir, m| dir.join(m));
            let declaring = if folder.is_empty() {
                dir.join("main.rs")
            } else {
                dir.join("mod.rs")
            };
            std::fs::read_to_string(declaring)
                .map(|text| declared_modules(&text))
                .unwrap_or_default()
        };
        for edge in edges(&module, &code, &order, &shown) {
            problems.push(edge.to_string());
        }
    }
    Ok(problems)
}

/// The module path of a file under `src/`: `walk/native.rs` is `[walk, native]`, `walk/mod.rs`
/// is `[walk]`, `main.rs` is `[]`.
pub fn module_path(relative: &Path) -> Vec<String> {
    let mut path: Vec<String> = relative
        .components()
        .filter_map(|c| c.as_os_str().to_str().map(str::to_owned))
        .collect();
    if let Some(last) = path.pop() {
        let name = last.strip_suffix(".rs").unwrap_or(&last).to_owned();
        if name != "mod" && name != "main" && name != "lib" {
            path.push(name);
        }
    }
    path
}

/// The imports of `module` (its path) in `code` against the order `order` gives for each
/// folder (by its path).
pub fn edges(
    module: &[String],
    code: &str,
    order: &dyn Fn(&[String]) -> Vec<String>,
    file: &Path,
) -> Vec<BpfEdge> {
    let mut found = Vec::new();
    for (offset, target) in module_references(module, code) {
        let Some(why) = against_order(module, &target, order) else {
            continue;
        };
        let edge = BpfEdge {
            file: file.to_owned(),
            line: code[..offset].matches('\n').count() + 1,
            from: module.join("::"),
            to: target.join("::"),
            why,
        };
        if !found.contains(&edge) {
            found.push(edge);
        }
    }
    found
}

/// Why naming `target` from `module` goes against the order, or `None` when it does not.
fn against_order(
    module: &[String],
    target: &[String],
    order: &dyn Fn(&[String]) -> Vec<String>,
) -> Option<&'static str> {
    let common = module
        .iter()
        .zip(target)
        .take_while(|(a, b)| a == b)
        .count();
    if common == target.len() {
        // Itself or an item of its own; or one of its parents, which sit above their files.
        return (common < module.len()).then_some("its parent, which sits above its files");
    }
    if common == module.len() {
        return None; // A descendant: a folder's `mod.rs` uses its files.
    }
    let declared = order(&module[..common]);
    let rank = |name: &String| declared.iter().position(|m| m == name);
    match (rank(&module[common]), rank(&target[common])) {
        (Some(own), Some(other)) if other < own => None,
        (Some(_), Some(_)) => Some("which is declared after it"),
        // An item, not a module, of a common ancestor: that ancestor's file.
        (_, None) if common + 1 == target.len() => Some("its parent, which sits above its files"),
        _ => Some("which is not declared in order (main.rs, or its folder's mod.rs)"),
    }
}

/// (byte offset, absolute module path) of each path rooted at `crate::`, `super::` or
/// `self::`, with grouped imports expanded: `use crate::{a::{b, c}, d}` names `a::b`, `a::c`
/// and `d`. Only the segments that may be modules are kept: a path stops at its last `::`.
fn module_references(module: &[String], code: &str) -> Vec<(usize, Vec<String>)> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let (prefix, skip): (Vec<String>, usize) = if rest.starts_with("crate::") {
            (Vec::new(), "crate::".len())
        } else if rest.starts_with("super::") {
            (
                module[..module.len().saturating_sub(1)].to_vec(),
                "super::".len(),
            )
        } else if rest.starts_with("self::") {
            (module.to_vec(), "self::".len())
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        // `scorch_crate::x`, `a::self::x` are not paths from this crate's root.
        if i > 0 && (super::is_ident(bytes[i - 1]) || bytes[i - 1] == b':') {
            i += skip;
            continue;
        }
        for path in expand(prefix, &code[i + skip..]) {
            found.push((i, path));
        }
        i += skip;
    }
    found
}

/// The module paths a path's tail names after `prefix`: its `::`-joined segments (all but the
/// last, which may be an item), or each item of a `{...}` group.
fn expand(prefix: Vec<String>, tail: &str) -> Vec<Vec<String>> {
    let mut path = prefix;
    let mut rest = tail;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            return group_items(group)
                .into_iter()
                .flat_map(|item| {
                    if item.trim() == "self" {
                        vec![path.clone()]
                    } else {
                        expand(path.clone(), item.trim_start())
                    }
                })
                .collect();
        }
        let name: String = rest
            .chars()
            .take_while(|&c| c.is_ascii_alphanumeric() || c == '_')
            .collect();
        if name.is_empty() {
            return vec![path];
        }
        let after = &rest[name.len()..];
        match after.strip_prefix("::") {
            Some(next) => {
                path.push(name);
                rest = next;
            }
            // The last segment: a module when it is one (`use crate::shared::stack;`), an item
            // otherwise. Kept as a module: an item of a module declared earlier is named by
            // its module's path, which is checked.
            None => {
                path.push(name);
                return vec![path];
            }
        }
    }
}

/// The items of a `{...}` group (the text after its opening brace), each up to its comma.
fn group_items(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items
        .into_iter()
        .filter(|item| !item.trim().is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(folder: &[String]) -> Vec<String> {
        let names: &[&str] = match folder.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            [] => &["shared", "runtimes", "walk", "programs"],
            ["shared"] => &["loops", "stack"],
            ["walk"] => &["native"],
            _ => &[],
        };
        names.iter().map(|n| n.to_string()).collect()
    }

    fn found(file: &str, code: &str) -> Vec<String> {
        let code = strip_tests(&strip_comments_and_strings(code));
        edges(
            &module_path(Path::new(file)),
            &code,
            &order,
            Path::new(file),
        )
        .into_iter()
        .map(|e| format!("{}->{}@{}", e.from, e.to, e.line))
        .collect()
    }

    #[test]
    fn imports_down_the_order_pass() {
        let code = "use crate::{\n    runtimes,\n    shared::{loops::repeat, stack::{self, WalkState}},\n};\nmod native;\nuse native::frame;\nfn f() { self::native::frame(); crate::walk::native::x(); }\n";
        assert!(
            found("walk/mod.rs", code).is_empty(),
            "{:?}",
            found("walk/mod.rs", code)
        );
        assert!(found(
            "shared/stack.rs",
            "use crate::shared::loops::repeat;\nuse super::loops;\n"
        )
        .is_empty());
    }

    #[test]
    fn imports_up_the_order_are_named_with_their_line() {
        assert_eq!(
            found(
                "runtimes/python.rs",
                "use crate::shared::stack::WalkState;\nuse crate::walk::x;\n"
            ),
            ["runtimes::python->walk::x@2"]
        );
        assert_eq!(
            found(
                "shared/loops.rs",
                "use crate::{\n    shared::stack::WalkState,\n};\n"
            ),
            ["shared::loops->shared::stack::WalkState@1"]
        );
        assert_eq!(
            found("shared/loops.rs", "use super::stack;\n"),
            ["shared::loops->shared::stack@1"]
        );
    }

    #[test]
    fn a_file_naming_its_folder_or_an_undeclared_module_is_named() {
        assert_eq!(
            found("walk/native.rs", "use crate::walk::step;\n"),
            ["walk::native->walk::step@1"]
        );
        assert_eq!(
            found("walk/native.rs", "use super::count;\n"),
            ["walk::native->walk::count@1"]
        );
        assert_eq!(
            found("programs/x.rs", "use crate::ghost::y;\n"),
            ["programs::x->ghost::y@1"]
        );
    }

    #[test]
    fn the_bpf_crate_as_it_is_passes() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let problems = check(&root).unwrap();
        assert!(problems.is_empty(), "{problems:#?}");
    }
}
