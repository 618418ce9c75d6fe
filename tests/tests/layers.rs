//! No two modules of any workspace crate import each other, directly or round a circle.
//!
//! Every `.rs` file under `crates/*/src` is a node named by its module path (`proxy::route::pool`
//! for crates/proxy/src/route/pool.rs, `proxy::route` for route/mod.rs, `proxy` for lib.rs or
//! main.rs). An edge is a path written in the file's code (comments and strings skipped):
//!
//! - `crate::a::b::X`, resolved to the longest module path that exists (`a::b`); an item a
//!   module re-exports (`pub use m::{X}` in lib.rs) resolves to the module it comes from (`m`),
//!   an item defined in lib.rs itself to the crate root;
//! - `super::x` and `self::x`, relative to the module the code is in (an inline `mod tests`
//!   counts as one level, so its `super::` is the file's own module);
//! - `m::x` where `m` is a submodule of the file's module (lib.rs's `reload::ReloadState`).
//!
//! A module folder's files are separate nodes: route/pool.rs's `super::Single` is an edge
//! `route::pool -> route`. Circles are found as strongly connected components, and the test
//! fails on any: none is allowed, not even a known one.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// One source file: its module path inside its crate (empty for the crate root) and its text.
struct SourceFile {
    module: Vec<String>,
    text: String,
}

/// The workspace's crate folders: (crate name as the nodes spell it, its src/ folder).
fn workspace_crates() -> Vec<(String, PathBuf)> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates");
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(&crates)
        .expect("read crates/")
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.join("src").is_dir())
        .map(|path| {
            let name = path.file_name().expect("crate folder name");
            (name.to_string_lossy().into_owned(), path.join("src"))
        })
        .collect();
    found.sort();
    found
}

/// Every `.rs` file below `src`, with its module path.
fn crate_files(src: &Path) -> Vec<SourceFile> {
    let mut files = Vec::new();
    let mut folders = vec![src.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("read source folder") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(src).expect("below src");
                files.push(SourceFile {
                    module: module_path(relative),
                    text: std::fs::read_to_string(&path).expect("read source file"),
                });
            }
        }
    }
    files
}

/// `a/b.rs` -> a::b, `a/mod.rs` -> a, `lib.rs` and `main.rs` -> the root (empty).
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().expect("a file name");
    let stem = file.trim_end_matches(".rs");
    let is_root = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !is_root {
        parts.push(stem.to_string());
    }
    parts
}

/// The code of a file as tokens: identifiers (with `$crate` as `crate`), `::` and single
/// punctuation characters. Comments, strings, chars and numbers are dropped.
fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // Block comments nest in Rust.
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_string(&chars, i + 1);
        } else if c == 'r' && matches!(next, Some('"') | Some('#')) && raw_string_start(&chars, i) {
            i = skip_raw_string(&chars, i + 1);
        } else if c == 'b' && next == Some('r') && raw_string_start(&chars, i + 1) {
            i = skip_raw_string(&chars, i + 2);
        } else if c == 'b' && next == Some('"') {
            i = skip_string(&chars, i + 2);
        } else if c == '\'' {
            i = skip_char_or_lifetime(&chars, i);
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c == ':' && next == Some(':') {
            out.push("::".to_string());
            i += 2;
        } else if c == '$' {
            // `$crate::` in a macro is `crate::`.
            i += 1;
        } else {
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

/// Whether `r` at `i` opens a raw string (`r"`, `r#"`), not an identifier such as `r#type`.
fn raw_string_start(chars: &[char], i: usize) -> bool {
    let before_is_ident = i > 0 && (chars[i - 1].is_ascii_alphanumeric() || chars[i - 1] == '_');
    let mut j = i + 1;
    while chars.get(j) == Some(&'#') {
        j += 1;
    }
    !before_is_ident && chars.get(j) == Some(&'"')
}

/// Past the closing quote of a string whose text starts at `i`.
fn skip_string(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Past a raw string whose `#`s (or opening quote) start at `i`.
fn skip_raw_string(chars: &[char], mut i: usize) -> usize {
    let mut hashes = 0;
    while chars.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    i += 1; // the opening quote
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

/// Past a char literal (`'a'`, `'\n'`, `'\''`) or a lifetime's quote (`'a` in `&'a str`).
fn skip_char_or_lifetime(chars: &[char], i: usize) -> usize {
    if chars.get(i + 1) == Some(&'\\') {
        // The escaped character may itself be a quote (`'\''`).
        let mut j = i + 3;
        while j < chars.len() && chars[j] != '\'' {
            j += 1;
        }
        return j + 1;
    }
    if chars.get(i + 2) == Some(&'\'') {
        return i + 3;
    }
    i + 1 // a lifetime: its name is read as an identifier next
}

/// A path as written, with the module the code it stands in belongs to.
#[derive(Debug, PartialEq)]
struct Written {
    /// The module the code is in: the file's, plus any inline `mod x { ... }` around it.
    within: Vec<String>,
    segments: Vec<String>,
}

/// Every path in `tokens` that starts a reference: `crate::`, `super::`, `self::` or an
/// identifier followed by `::` (not itself after `::`). A `use` group (`a::{b::C, d}`) gives
/// one path per leaf. `module` is the file's module.
fn written_paths(tokens: &[String], module: &[String]) -> Vec<Written> {
    let mut found = Vec::new();
    // Inline modules open around the current token: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let token = tokens[i].as_str();
        match token {
            "{" => depth += 1,
            "}" => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "mod" if tokens.get(i + 2).is_some_and(|t| t == "{") => {
                inline.push((tokens[i + 1].clone(), depth + 1));
            }
            _ => {}
        }
        let starts = is_ident(token)
            && tokens.get(i + 1).is_some_and(|t| t == "::")
            && (i == 0 || tokens[i - 1] != "::");
        if starts {
            let within: Vec<String> = module
                .iter()
                .cloned()
                .chain(inline.iter().map(|(name, _)| name.clone()))
                .collect();
            let mut leaves = Vec::new();
            i = read_path(tokens, i, Vec::new(), &mut leaves);
            for leaf in leaves {
                found.push(Written {
                    within: within.clone(),
                    segments: leaf.segments,
                });
            }
            continue;
        }
        i += 1;
    }
    found
}

fn is_ident(token: &str) -> bool {
    token
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
}

/// One path of a `use` tree or expression: its segments, the name it is known by here
/// (the last segment, or the alias after `as`), and whether it ends in `::*`.
struct Leaf {
    segments: Vec<String>,
    name: String,
    glob: bool,
}

/// Reads the path at `i` (after `prefix`), expanding `{...}` groups; returns the index after it.
fn read_path(
    tokens: &[String],
    mut i: usize,
    mut prefix: Vec<String>,
    leaves: &mut Vec<Leaf>,
) -> usize {
    let leaf = |segments: Vec<String>, alias: Option<&String>, glob: bool| Leaf {
        name: alias.or(segments.last()).cloned().unwrap_or_default(),
        segments,
        glob,
    };
    while i < tokens.len() && is_ident(&tokens[i]) {
        prefix.push(tokens[i].clone());
        i += 1;
        if tokens.get(i).is_some_and(|t| t == "::") {
            i += 1;
        } else if tokens.get(i).is_some_and(|t| t == "as") {
            leaves.push(leaf(prefix, tokens.get(i + 1), false));
            return i + 2;
        } else {
            leaves.push(leaf(prefix, None, false));
            return i;
        }
    }
    if tokens.get(i).is_some_and(|t| t == "{") {
        i += 1;
        while i < tokens.len() && tokens[i] != "}" {
            if is_ident(&tokens[i]) || tokens[i] == "*" {
                i = read_path(tokens, i, prefix.clone(), leaves);
            } else {
                i += 1; // `,`
            }
        }
        return i + 1;
    }
    // `a::*` or `a::<T>`: the path so far.
    let glob = tokens.get(i).is_some_and(|t| t == "*");
    leaves.push(leaf(prefix, None, glob));
    i + usize::from(glob)
}

/// One crate's modules and what each re-exports.
struct CrateModules {
    name: String,
    files: BTreeMap<Vec<String>, SourceFile>,
}

impl CrateModules {
    fn node(&self, module: &[String]) -> String {
        std::iter::once(self.name.as_str())
            .chain(module.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join("::")
    }

    /// The module a path written in `within` refers to, or None when it leaves the crate.
    fn resolve(&self, written: &Written) -> Option<Vec<String>> {
        let mut segments = written.segments.iter().peekable();
        let mut absolute: Vec<String> = match segments.peek().map(|s| s.as_str()) {
            Some("crate") => {
                segments.next();
                Vec::new()
            }
            Some("self") => {
                segments.next();
                written.within.clone()
            }
            Some("super") => {
                let mut base = written.within.clone();
                while segments.peek().is_some_and(|s| *s == "super") {
                    segments.next();
                    base.pop();
                }
                base
            }
            Some(first) => {
                // A relative path is the crate's only when it names a submodule here.
                let mut child = written.within.clone();
                child.push(first.to_string());
                if !self.files.contains_key(&child) {
                    return None;
                }
                written.within.clone()
            }
            None => return None,
        };
        absolute.extend(segments.cloned());
        Some(self.longest_module(&absolute, 0))
    }

    /// The longest module path that `path` starts with, following re-exports of the item
    /// right after it (depth-bounded, in case two modules re-export from each other).
    fn longest_module(&self, path: &[String], hops: usize) -> Vec<String> {
        let mut length = path.len();
        while length > 0 && !self.files.contains_key(&path[..length]) {
            length -= 1;
        }
        let module = path[..length].to_vec();
        let Some(item) = path.get(length) else {
            return module;
        };
        if hops < 4 {
            if let Some(source) = self.re_export(&module, item) {
                let mut next = source;
                next.extend(path[length + 1..].iter().cloned());
                return self.longest_module(&next, hops + 1);
            }
        }
        module
    }

    /// Where `module` gets `item` from when it re-exports it (`pub use m::{item}` or
    /// `pub use m::*` with `item` in m), as an absolute path to the item.
    fn re_export(&self, module: &[String], item: &str) -> Option<Vec<String>> {
        for leaf in self.public_uses(module) {
            let written = Written {
                within: module.to_vec(),
                segments: leaf.segments,
            };
            let Some(mut absolute) = self.absolute(&written) else {
                continue;
            };
            if !leaf.glob && leaf.name == item {
                return Some(absolute);
            }
            if leaf.glob && self.names(&absolute, item) {
                absolute.push(item.to_string());
                return Some(absolute);
            }
        }
        None
    }

    /// The leaves of `module`'s `pub use` (and `pub(crate) use`) items.
    fn public_uses(&self, module: &[String]) -> Vec<Leaf> {
        let Some(file) = self.files.get(module) else {
            return Vec::new();
        };
        let tokens = tokens(&file.text);
        let mut leaves = Vec::new();
        for (at, _) in tokens.iter().enumerate().filter(|(_, t)| *t == "use") {
            if tokens[..at].last().is_some_and(|t| t == "pub" || t == ")") {
                read_path(&tokens, at + 1, Vec::new(), &mut leaves);
            }
        }
        leaves
    }

    /// A written path made absolute (crate-relative), without resolving modules.
    fn absolute(&self, written: &Written) -> Option<Vec<String>> {
        let first = written.segments.first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            _ => written.within.clone(),
        };
        let mut rest = written.segments.iter().peekable();
        match first.as_str() {
            "crate" | "self" => {
                rest.next();
            }
            "super" => {
                while rest.peek().is_some_and(|s| *s == "super") {
                    rest.next();
                    base.pop();
                }
            }
            _ => {}
        }
        base.extend(rest.cloned());
        Some(base)
    }

    /// Whether `module` has `item`: defines it (a fn, type, trait, const or static) or
    /// re-exports it by name.
    fn names(&self, module: &[String], item: &str) -> bool {
        let Some(file) = self.files.get(module) else {
            return false;
        };
        let defined = tokens(&file.text).windows(2).any(|pair| {
            matches!(
                pair[0].as_str(),
                "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union"
            ) && pair[1] == item
        });
        defined
            || self
                .public_uses(module)
                .iter()
                .any(|leaf| !leaf.glob && leaf.name == item)
    }

    /// Each module's edges to the other modules of this crate.
    fn graph(&self) -> Graph {
        let mut graph = Graph::new();
        for (module, file) in &self.files {
            let from = self.node(module);
            let edges = graph.entry(from.clone()).or_default();
            for written in written_paths(&tokens(&file.text), module) {
                let Some(target) = self.resolve(&written) else {
                    continue;
                };
                let to = self.node(&target);
                if to != from {
                    edges.insert(to);
                }
            }
        }
        graph
    }
}

fn workspace_graph() -> Graph {
    let mut graph = Graph::new();
    for (name, src) in workspace_crates() {
        let files = crate_files(&src)
            .into_iter()
            .map(|file| (file.module.clone(), file))
            .collect();
        graph.extend(CrateModules { name, files }.graph());
    }
    graph
}

/// The strongly connected components with more than one module (Tarjan's algorithm): each
/// is a set of modules that all reach each other.
fn circles(graph: &Graph) -> Vec<BTreeSet<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a str) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.graph.get(node).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = BTreeSet::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    component.insert(top.to_string());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node.as_str()) {
            walk.visit(node);
        }
    }
    walk.found
}

/// One circle through `component`'s modules, first module repeated at the end, for the
/// message: the shortest way back to its first module.
fn one_circle(graph: &Graph, component: &BTreeSet<String>) -> Vec<String> {
    let start = component.iter().next().expect("a non-empty component");
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.as_str()]);
    while let Some(node) = queue.pop_front() {
        for next in graph.get(node).into_iter().flatten() {
            if !component.contains(next) {
                continue;
            }
            if next == start {
                let mut path = vec![start.clone()];
                let mut at = node;
                while at != start {
                    path.push(at.to_string());
                    at = came_from[at];
                }
                path.push(start.clone());
                path.reverse();
                return path;
            }
            if !came_from.contains_key(next.as_str()) {
                came_from.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    vec![start.clone()]
}

#[test]
fn no_module_of_any_crate_imports_round_a_circle() {
    let graph = workspace_graph();
    // The graph was read: a path through several crates' modules, folders and roots is there.
    let sees = |from: &str, to: &str| graph.get(from).is_some_and(|edges| edges.contains(to));
    assert!(
        sees("proxy::dispatch", "proxy::route")
            && sees("proxy::route::pool", "proxy::route::leg")
            && sees("config::load", "config::raw")
            && sees("backend::connection", "backend::connection::link")
            && sees("control", "control::reload")
            && sees("control::admin", "control::admin::state")
            // The route tree's two recursions, each through a module below the kinds: the
            // walk hands a node to its kind, the kind runs its children through `RunChild`.
            && sees("proxy::route::walk", "proxy::route::failover")
            && sees("proxy::route::failover", "proxy::route::children")
            && sees("proxy::route::resume", "proxy::route::then"),
        "expected edges not found; the scan is broken: {graph:#?}"
    );
    let found = circles(&graph);
    let each: Vec<String> = found
        .iter()
        .map(|component| one_circle(&graph, component).join(" -> "))
        .collect();
    assert!(
        each.is_empty(),
        "import circles between modules:\n  {}\n(each set of modules that reach each other: {found:?})",
        each.join("\n  ")
    );
}

#[cfg(test)]
mod scanner {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn paths(text: &str, module: &[&str]) -> Vec<(Vec<String>, Vec<String>)> {
        written_paths(&tokens(text), &strings(module))
            .into_iter()
            .map(|w| (w.within, w.segments))
            .collect()
    }

    #[test]
    fn grouped_imports_are_read_and_comments_and_strings_skipped() {
        let text = "use crate::{alpha::A, beta::{b, c as d}};\n// crate::gamma in a comment\n\
                    /* crate::zeta */ let s = \"crate::eta\"; let x = crate::delta::f(); // crate::epsilon\n";
        let found: Vec<Vec<String>> = paths(text, &[]).into_iter().map(|(_, s)| s).collect();
        assert_eq!(
            found,
            [
                strings(&["crate", "alpha", "A"]),
                strings(&["crate", "beta", "b"]),
                strings(&["crate", "beta", "c"]),
                strings(&["crate", "delta", "f"]),
            ]
        );
    }

    #[test]
    fn super_in_an_inline_module_is_the_files_own_module() {
        let text = "use super::pool;\nmod tests {\n    use super::*;\n    fn f(x: &'a str) { let c = '{'; }\n}\nuse super::after;";
        let found = paths(text, &["route", "resize"]);
        let within: Vec<Vec<String>> = found.iter().map(|(w, _)| w.clone()).collect();
        assert_eq!(
            within,
            [
                strings(&["route", "resize"]),
                strings(&["route", "resize", "tests"]),
                strings(&["route", "resize"]),
            ]
        );
    }

    fn modules(files: &[(&[&str], &str)]) -> CrateModules {
        CrateModules {
            name: "c".to_string(),
            files: files
                .iter()
                .map(|(module, text)| {
                    let module = strings(module);
                    let file = SourceFile {
                        module: module.clone(),
                        text: text.to_string(),
                    };
                    (module, file)
                })
                .collect(),
        }
    }

    #[test]
    fn paths_resolve_to_modules_re_exports_and_the_root() {
        let c = modules(&[
            (
                &[],
                "mod m; mod route; pub use m::{Thing}; pub use route::*; pub struct Handle; fn f() { m::g(); }",
            ),
            (&["m"], "pub struct Thing;"),
            (&["route"], "pub struct Single; mod pool;"),
            (&["route", "pool"], "use super::Single; use crate::Handle;"),
            (&["other"], "use crate::Thing; use crate::Single; use crate::route::pool::x;"),
        ]);
        let graph = c.graph();
        let edges = |node: &str| -> Vec<&str> { graph[node].iter().map(String::as_str).collect() };
        assert_eq!(edges("c"), ["c::m", "c::route"]);
        assert_eq!(edges("c::route::pool"), ["c", "c::route"]);
        assert_eq!(edges("c::other"), ["c::m", "c::route", "c::route::pool"]);
    }

    #[test]
    fn module_paths_follow_the_file_layout() {
        assert_eq!(module_path(Path::new("lib.rs")), Vec::<String>::new());
        assert_eq!(module_path(Path::new("main.rs")), Vec::<String>::new());
        assert_eq!(module_path(Path::new("route/mod.rs")), strings(&["route"]));
        assert_eq!(
            module_path(Path::new("route/pool.rs")),
            strings(&["route", "pool"])
        );
    }

    #[test]
    fn a_circle_is_found_and_named() {
        let graph: Graph = [
            ("a", vec!["b"]),
            ("b", vec!["c"]),
            ("c", vec!["a"]),
            ("d", vec!["a"]),
            ("e", vec![]),
        ]
        .into_iter()
        .map(|(n, e)| (n.to_string(), e.into_iter().map(String::from).collect()))
        .collect();
        let found = circles(&graph);
        assert_eq!(found.len(), 1);
        assert_eq!(one_circle(&graph, &found[0]), ["a", "b", "c", "a"]);
        let acyclic: Graph = [("a", vec!["b"]), ("b", vec![])]
            .into_iter()
            .map(|(n, e)| (n.to_string(), e.into_iter().map(String::from).collect()))
            .collect();
        assert!(circles(&acyclic).is_empty());
    }
}
