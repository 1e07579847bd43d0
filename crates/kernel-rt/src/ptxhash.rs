//! Source hashing for the committed PTX (`cargo xtask ptx-build` writes it,
//! the kernel crates' freshness tests and `ptx-build --check` read it).
//!
//! The first line of every generated PTX file is
//! `// mha-kit-ptx sha256=<hex> toolchain=<version> arch=<arch>`, where the hash
//! covers the `.cu` source and every header it includes (transitively, quoted
//! includes only), each as `path-relative-to-workspace NUL content NUL`, in
//! the order they are first reached.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Prefix of the first line of a generated PTX file.
pub const HEADER_PREFIX: &str = "// mha-kit-ptx sha256=";

/// The quoted `#include "..."` targets of a source text, in order.
pub fn quoted_includes(src: &str) -> Vec<String> {
    src.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix('#')?.trim_start().strip_prefix("include")?;
            let rest = rest.trim_start().strip_prefix('"')?;
            Some(rest[..rest.find('"')?].to_string())
        })
        .collect()
}

/// Resolves the transitive quoted includes of `source` against its own
/// folder, then `include_dirs`. Returns the source followed by every header
/// found, in first-reached order. Includes not found (toolchain headers) are
/// skipped: the toolchain version covers them.
pub fn source_closure(source: &Path, include_dirs: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    let mut stack = vec![source.to_path_buf()];
    while let Some(file) = stack.pop() {
        let canon = file.canonicalize()?;
        if !seen.insert(canon.clone()) {
            continue;
        }
        let text = std::fs::read_to_string(&canon)?;
        out.push(canon.clone());
        let dir = canon.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut found = Vec::new();
        for inc in quoted_includes(&text) {
            let candidates =
                std::iter::once(dir.join(&inc)).chain(include_dirs.iter().map(|d| d.join(&inc)));
            if let Some(p) = candidates.into_iter().find(|p| p.is_file()) {
                found.push(p);
            }
        }
        // Depth-first in source order.
        stack.extend(found.into_iter().rev());
    }
    Ok(out)
}

/// sha256 (hex) of `files`, each named relative to `root`.
pub fn hash_files(root: &Path, files: &[PathBuf]) -> std::io::Result<String> {
    let root = root.canonicalize()?;
    let mut h = Sha256::new();
    for f in files {
        let rel = f.strip_prefix(&root).unwrap_or(f);
        h.update(rel.to_string_lossy().replace('\\', "/").as_bytes());
        h.update([0u8]);
        h.update(std::fs::read(f)?);
        h.update([0u8]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The header line for a PTX file.
pub fn header_line(sha: &str, toolchain: &str, arch: &str) -> String {
    format!("{HEADER_PREFIX}{sha} toolchain={toolchain} arch={arch}")
}

/// The sha256 recorded in a PTX file's first line, if it has one.
pub fn recorded_hash(ptx: &str) -> Option<&str> {
    let first = ptx.lines().next()?;
    let rest = first.strip_prefix(HEADER_PREFIX)?;
    Some(rest.split_whitespace().next().unwrap_or(""))
}

/// Checks that the committed PTX of `kernel` (a `.cu` path in a crate's
/// `kernels/`) was generated from the current sources. `workspace_root` is
/// the folder paths are hashed relative to.
///
/// # Errors
/// A message naming the stale file.
pub fn check_fresh(workspace_root: &Path, kernel: &Path, ptx: &str) -> Result<(), String> {
    let include = workspace_root.join("crates/kernel-rt/include");
    let files =
        source_closure(kernel, &[include]).map_err(|e| format!("{}: {e}", kernel.display()))?;
    let sha = hash_files(workspace_root, &files).map_err(|e| e.to_string())?;
    match recorded_hash(ptx) {
        Some(r) if r == sha => Ok(()),
        Some(r) => Err(format!(
            "PTX for {} is stale (records {r}, sources hash to {sha}): run `cargo xtask ptx-build`",
            kernel.display()
        )),
        None => Err(format!(
            "PTX for {} has no mha-kit-ptx header line",
            kernel.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_quoted_includes_only() {
        let src = "#include \"mha_kit/common.cuh\"\n  #  include \"a.cuh\"\n#include <cuda_bf16.h>\n// #include \"no\"\n";
        assert_eq!(quoted_includes(src), vec!["mha_kit/common.cuh", "a.cuh"]);
    }

    #[test]
    fn header_round_trip() {
        let line = header_line("abc123", "nvrtc-12.4", "compute_90");
        assert_eq!(
            recorded_hash(&format!("{line}\n.version 8.4\n")),
            Some("abc123")
        );
        assert_eq!(recorded_hash(".version 8.4\n"), None);
    }
}
