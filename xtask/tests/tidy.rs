//! Tidy: every documentation reference in the repository resolves inside it,
//! and no Rust source file under a `src/` directory is longer than 800 lines.
//!
//! - every `<name>.md` (with or without a `§` section) names a Markdown file of
//!   the repository;
//! - `§<family>.<n>` (a section of `docs/SEMANTICS.md`, also as the end of a
//!   range `§<family>.<n>–<m>`) and a bare `§<family>` have their heading there;
//! - no bare numbered citation `§<n>` (a `§` followed by a digit: a section of
//!   a document that is not named; cite `SEMANTICS.md §<family>.<n>`);
//! - every decision id `D<n>` has a row in the Decisions table of `docs/DESIGN.md`;
//! - nothing points into the project's shared folder outside the repository,
//!   and no relative path (`../…`) climbs above the repository root from the
//!   directory of the file that names it.
//!
//! Scanned: `.rs`, `.cu`, `.cuh`, `.py`, `.md`, `.toml` and `.sh` files outside
//! `target/` and hidden directories, plus the tracked files of hidden
//! directories listed in `HIDDEN_FILES` (the CI script and the cargo config).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Files in hidden directories that are scanned too.
const HIDDEN_FILES: [&str; 2] = [".ci/run", ".cargo/config.toml"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            walk(&path, out);
        } else if ["rs", "cu", "cuh", "py", "md", "toml", "sh"]
            .iter()
            .any(|e| path.extension().is_some_and(|x| x == *e))
        {
            out.push(path);
        }
    }
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The anchors of `docs/SEMANTICS.md`: `family` for a `{#family}` heading and
/// `family.n` for a `§family.n` heading.
fn semantics_anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    for line in text.lines().filter(|l| l.starts_with('#')) {
        if let Some(i) = line.find("{#") {
            let rest = &line[i + 2..];
            anchors.insert(rest[..rest.find('}').unwrap_or(rest.len())].to_string());
        }
        if let Some(i) = line.find('§') {
            let rest = &line[i + '§'.len_utf8()..];
            let end = rest.find(' ').unwrap_or(rest.len());
            anchors.insert(rest[..end].to_string());
        }
    }
    anchors
}

/// Decision ids defined by the Decisions table of `docs/DESIGN.md`.
fn decision_ids(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| D"))
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            (!digits.is_empty() && rest[digits.len()..].starts_with(" |"))
                .then(|| format!("D{digits}"))
        })
        .collect()
}

/// `§family.n` / `§family` citations of a text, range ends included.
fn section_refs(text: &str) -> Vec<String> {
    let mut refs = Vec::new();
    for (i, _) in text.match_indices('§') {
        let rest = &text[i + '§'.len_utf8()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
            continue;
        }
        let after = &rest[name.len()..];
        let num: String = after
            .strip_prefix('.')
            .map(|s| {
                let n: String = s
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.')
                    .collect();
                n.trim_end_matches('.').to_string()
            })
            .unwrap_or_default();
        if num.is_empty() {
            refs.push(name);
            continue;
        }
        refs.push(format!("{name}.{num}"));
        // A range `§family.a–b`: b is a section of the same family.
        let tail = &after[1 + num.len()..];
        if let Some(t) = tail.strip_prefix('–').or_else(|| tail.strip_prefix('-')) {
            let end: String = t
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let end = end.trim_end_matches('.');
            if !end.is_empty() {
                refs.push(format!("{name}.{end}"));
            }
        }
    }
    refs
}

/// Whether a path-like token of a line climbs above the repository root when
/// resolved from a directory `depth` levels below the root (`..` components
/// count up, named components down).
fn leaves_repository(depth: usize, token: &str) -> bool {
    let mut depth = depth as isize;
    for part in token.split('/') {
        match part {
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            "" | "." => {}
            _ => depth += 1,
        }
    }
    false
}

/// The relative path tokens of a line that start with `../`.
fn parent_paths(line: &str) -> Vec<&str> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_-./".contains(c);
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("../") {
        let start = rest[..i]
            .rfind(|c: char| !path_char(c))
            .map_or(0, |j| j + rest[j..].chars().next().unwrap().len_utf8());
        let end = i + rest[i..]
            .find(|c: char| !path_char(c))
            .unwrap_or(rest.len() - i);
        let token = &rest[start..end];
        if token.starts_with("../") {
            out.push(token);
        }
        rest = &rest[end..];
    }
    out
}

#[test]
fn parent_paths_are_checked_against_the_root() {
    assert_eq!(
        parent_paths(r#"join("../..") x ../ptx/a.ptx"#),
        ["../..", "../ptx/a.ptx"]
    );
    assert!(parent_paths("a/../b and ..n/2").is_empty());
    assert!(!leaves_repository(3, "../.."));
    assert!(leaves_repository(1, "../../x"));
    assert!(leaves_repository(0, "../shared/data"));
    assert!(!leaves_repository(2, "../kernel-rt"));
    assert!(leaves_repository(2, "../x/../../.."));
}

#[test]
fn doc_references_resolve_inside_the_repository() {
    let root = repo_root();
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.extend(
        HIDDEN_FILES
            .iter()
            .map(|f| root.join(f))
            .filter(|p| p.is_file()),
    );
    let md_names: BTreeSet<String> = files
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let semantics = fs::read_to_string(root.join("docs/SEMANTICS.md")).unwrap();
    let anchors = semantics_anchors(&semantics);
    let design = fs::read_to_string(root.join("docs/DESIGN.md")).unwrap();
    let decisions = decision_ids(&design);
    assert!(
        decisions.contains("D1"),
        "docs/DESIGN.md has no Decisions table"
    );
    let outside = [
        concat!("shared", "/spec"),
        concat!("shared", "/design"),
        concat!("..", "/shared"),
    ];
    let this_file = Path::new(file!()).file_name().unwrap();

    let mut bad = Vec::new();
    for path in &files {
        if path.file_name() == Some(this_file) {
            continue;
        }
        let Ok(text) = fs::read_to_string(path) else {
            continue;
        };
        let rel_path = path.strip_prefix(&root).unwrap();
        let rel = rel_path.display().to_string();
        let depth = rel_path.components().count() - 1;
        for (n, line) in text.lines().enumerate() {
            let at = format!("{rel}:{}", n + 1);
            for p in parent_paths(line) {
                if leaves_repository(depth, p) {
                    bad.push(format!("{at}: `{p}` leaves the repository (from `{rel}`)"));
                }
            }
            for (i, _) in line.match_indices('§') {
                let next = line[i + '§'.len_utf8()..].chars().next();
                if next.is_some_and(|c| c.is_ascii_digit()) {
                    bad.push(format!(
                        "{at}: bare numbered citation `§{}…`: cite `SEMANTICS.md §<family>.<n>`",
                        next.unwrap()
                    ));
                }
            }
            for o in outside {
                if line.contains(o) {
                    bad.push(format!("{at}: path outside the repository `{o}`"));
                }
            }
            for (i, _) in line.match_indices(".md") {
                if line[i + 3..].starts_with(is_word) {
                    continue;
                }
                let start = line[..i]
                    .rfind(|c: char| !(is_word(c) || c == '-'))
                    .map_or(0, |j| j + 1);
                let name = format!("{}.md", &line[start..i]);
                if !md_names.contains(&name) {
                    bad.push(format!("{at}: `{name}` is not in the repository"));
                }
            }
            for r in section_refs(line) {
                if !anchors.contains(&r) {
                    bad.push(format!(
                        "{at}: `§{r}` is not a section of docs/SEMANTICS.md"
                    ));
                }
            }
            let chars: Vec<char> = line.chars().collect();
            for (i, &c) in chars.iter().enumerate() {
                if c != 'D' || (i > 0 && is_word(chars[i - 1])) {
                    continue;
                }
                let digits: String = chars[i + 1..]
                    .iter()
                    .take_while(|c| c.is_ascii_digit())
                    .collect();
                let next = chars.get(i + 1 + digits.len()).copied();
                if (1..=2).contains(&digits.len()) && !next.is_some_and(is_word) {
                    let id = format!("D{digits}");
                    if !decisions.contains(&id) {
                        bad.push(format!(
                            "{at}: decision `{id}` has no row in docs/DESIGN.md"
                        ));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "unresolved references:\n{}", bad.join("\n"));
}

/// Source files stay small enough to read as one job: every `.rs` file under
/// a crate's (or xtask's) `src/` has at most 800 lines (split a file by
/// responsibility into a module directory when it grows past that).
#[test]
fn source_files_are_at_most_800_lines() {
    const MAX: usize = 800;
    let root = repo_root();
    let mut files = Vec::new();
    walk(&root, &mut files);
    let mut long = Vec::new();
    for path in files {
        let rel = path.strip_prefix(&root).unwrap_or(&path);
        let in_src = rel.components().any(|c| c.as_os_str() == "src");
        if !in_src || path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let n = fs::read_to_string(&path)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if n > MAX {
            long.push(format!("{}: {n} lines", rel.display()));
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX} lines:\n{}",
        long.join("\n")
    );
}
