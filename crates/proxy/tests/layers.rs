//! The modules of crates/proxy import each other in one direction only: the request path
//! (worker -> session -> dispatch -> pending -> route -> snapshot -> ...) never imports the side
//! (control, admin, reload), and no two modules import each other, directly or round a
//! circle. This test reads `src/*.rs` (and each module folder as one module), collects each module's `crate::MODULE` references
//! (comments skipped) and fails with the circle when there is one. docs/architecture.md
//! has the layer order.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Module name -> the crate modules it references. lib.rs is the root that declares and
/// wires every module, so it is not a node; a folder (`route/`) is one module, its files
/// read together.
fn module_graph(src: &Path) -> Graph {
    let mut sources = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("read src/") {
        let path = entry.expect("dir entry").path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        let text = if path.is_dir() {
            folder_text(&path)
        } else if path.extension().and_then(|s| s.to_str()) == Some("rs") && stem != "lib" {
            std::fs::read_to_string(&path).expect("read module")
        } else {
            continue;
        };
        sources.insert(stem.to_string(), text);
    }
    let modules: BTreeSet<String> = sources.keys().cloned().collect();
    sources
        .iter()
        .map(|(name, text)| {
            let edges = crate_references(text)
                .into_iter()
                .filter(|target| target != name && modules.contains(target))
                .collect();
            (name.clone(), edges)
        })
        .collect()
}

/// Every `.rs` file of a module folder, one after the other.
fn folder_text(folder: &Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(folder).expect("read module folder") {
        let path = entry.expect("dir entry").path();
        if path.extension().and_then(|s| s.to_str()) == Some("rs") {
            text.push_str(&std::fs::read_to_string(&path).expect("read module file"));
            text.push('\n');
        }
    }
    text
}

/// The first path segment after every `crate::` outside comments, including each item of
/// a grouped `crate::{a::X, b}` import.
fn crate_references(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    found.insert(first_segment(item.trim()));
                }
            } else {
                found.insert(first_segment(rest));
            }
        }
    }
    found
}

fn first_segment(path: &str) -> String {
    path.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// A circle of imports (first module repeated at the end), if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Visiting,
        Done,
    }
    fn visit(
        node: &str,
        graph: &Graph,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Visiting) => {
                let start = stack.iter().position(|n| n == node).unwrap_or(0);
                let mut cycle = stack[start..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Visiting);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    let mut stack = Vec::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut marks, &mut stack))
}

#[test]
fn proxy_modules_import_each_other_without_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    // The graph was read: the request path's modules are there and linked.
    assert!(
        graph["dispatch"].contains("route") && graph["route"].contains("snapshot"),
        "dispatch -> route -> snapshot not found; the scan is broken: {graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import circle between crates/proxy modules: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn the_scan_sees_grouped_imports_and_skips_comments() {
    let text = "use crate::{alpha::A, beta};\n// crate::gamma in a comment\nlet x = crate::delta::f(); // crate::epsilon\n";
    let found: Vec<String> = crate_references(text).into_iter().collect();
    assert_eq!(found, ["alpha", "beta", "delta"]);
}

#[test]
fn a_circle_is_reported_with_its_modules() {
    let graph: Graph = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(n, e)| (n.to_string(), e.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let acyclic: Graph = [("a", vec!["b"]), ("b", vec![])]
        .into_iter()
        .map(|(n, e)| (n.to_string(), e.into_iter().map(String::from).collect()))
        .collect();
    assert_eq!(find_cycle(&acyclic), None);
}
