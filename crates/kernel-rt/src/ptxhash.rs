//! Source hashing for the committed PTX and cubins (`cargo xtask ptx-build`
//! writes them, the kernel crates' freshness tests and `ptx-build --check`
//! read them).
//!
//! The first line of every generated PTX file is
//! `// mha-kit-ptx sha256=<hex> toolchain=<version> arch=<arch>`, where the hash
//! covers the `.cu` source and every header it includes (transitively, quoted
//! includes only), each as `path-relative-to-workspace NUL content NUL`, in
//! the order they are first reached.
//!
//! Next to each PTX, `ptx-build` writes the machine code `ptxas` makes of it,
//! `<module>.<sm>.cubin` (`sm_90`, or `sm_90a` for `.target sm_90a` PTX), and
//! a one-line stamp `<module>.<sm>.cubin.stamp`:
//! `mha-kit-cubin ptx-sha256=<hex> cubin-sha256=<hex> ptxas=<version> arch=<sm>`
//! ([`cubin_stamp`]). [`check_cubin`] compares the stamp with the embedded
//! PTX and cubin bytes, so a cubin left behind by a PTX change fails a plain
//! CPU test, without any CUDA install.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::gpu::{CubinArch, PtxModule};

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

/// Version of the pinned `ptxas` that assembles the committed cubins
/// (`nvidia-cuda-nvcc-cu12`, `ptxas --version` prints `V<this>`).
pub const PTXAS_VERSION: &str = "12.4.131";

/// Prefix of a cubin stamp line.
pub const CUBIN_STAMP_PREFIX: &str = "mha-kit-cubin ";

/// sha256 (hex) of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The real architecture `ptx-build` assembles a PTX text for: `sm_90a`
/// when its `.target` directive names `sm_90a`, else `sm_90`.
pub fn cubin_arch_of(ptx: &str) -> CubinArch {
    let target = ptx
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(".target "))
        .unwrap_or_default();
    if target.split([',', ' ']).any(|t| t.trim() == "sm_90a") {
        CubinArch::Sm90a
    } else {
        CubinArch::Sm90
    }
}

/// The stamp line (with a trailing newline) of a cubin assembled from `ptx`
/// by `ptxas` [`PTXAS_VERSION`] for `arch`.
pub fn cubin_stamp(ptx: &str, cubin: &[u8], arch: CubinArch) -> String {
    format!(
        "{CUBIN_STAMP_PREFIX}ptx-sha256={} cubin-sha256={} ptxas={PTXAS_VERSION} arch={}\n",
        sha256_hex(ptx.as_bytes()),
        sha256_hex(cubin),
        arch.name()
    )
}

/// What an ELF header says about a cubin: `Some((sm, arch_specific))`, e.g.
/// `(90, true)` for `sm_90a`, or `None` when `image` is not a 64-bit CUDA ELF
/// (`e_machine` 190). `e_flags` as ptxas 12.4 writes them: the low byte is
/// the SM number and bit 11 marks an arch-specific (`a`) target
/// (`0x5a055a` for sm_90, `0x5a0d5a` for sm_90a).
pub fn cubin_elf_arch(image: &[u8]) -> Option<(u32, bool)> {
    const EM_CUDA: u16 = 190;
    if image.len() < 64 || &image[..4] != b"\x7fELF" || image[4] != 2 || image[5] != 1 {
        return None;
    }
    let machine = u16::from_le_bytes([image[18], image[19]]);
    if machine != EM_CUDA {
        return None;
    }
    let flags = u32::from_le_bytes([image[48], image[49], image[50], image[51]]);
    Some((flags & 0xff, flags & 0x800 != 0))
}

/// Checks that `module` carries a cubin assembled from its current PTX: the
/// stamp records the sha256 of the embedded PTX and of the embedded cubin,
/// the pinned [`PTXAS_VERSION`] and the architecture the PTX's `.target`
/// asks for, and the cubin's ELF header names that architecture.
///
/// # Errors
/// A message naming the module and what does not match (run
/// `cargo xtask ptx-build` to regenerate).
pub fn check_cubin(module: &PtxModule) -> Result<(), String> {
    let name = module.name;
    let Some(cubin) = module.cubin else {
        return Err(format!("module {name} embeds no cubin"));
    };
    let want_arch = cubin_arch_of(module.ptx);
    if cubin.arch != want_arch {
        return Err(format!(
            "module {name}: cubin declared for {}, its PTX targets {}",
            cubin.arch.name(),
            want_arch.name()
        ));
    }
    let want = cubin_stamp(module.ptx, cubin.image, cubin.arch);
    if cubin.stamp != want {
        return Err(format!(
            "cubin of module {name} is stale: stamp `{}`, the embedded PTX and cubin give `{}`: run `cargo xtask ptx-build`",
            cubin.stamp.trim_end(),
            want.trim_end()
        ));
    }
    let elf = cubin_elf_arch(cubin.image);
    let want_elf = Some((90, cubin.arch == CubinArch::Sm90a));
    if elf != want_elf {
        return Err(format!(
            "cubin of module {name}: ELF header says {elf:?}, expected {want_elf:?} ({})",
            cubin.arch.name()
        ));
    }
    Ok(())
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

    #[test]
    fn cubin_arch_follows_the_ptx_target() {
        assert_eq!(
            cubin_arch_of(".version 8.4\n.target sm_90\n"),
            CubinArch::Sm90
        );
        assert_eq!(
            cubin_arch_of(".version 8.4\n.target sm_90a\n"),
            CubinArch::Sm90a
        );
        assert_eq!(cubin_arch_of("no target"), CubinArch::Sm90);
    }

    #[test]
    fn stamp_names_both_hashes_and_the_toolchain() {
        let s = cubin_stamp("ptx", b"elf", CubinArch::Sm90a);
        assert!(s.starts_with(CUBIN_STAMP_PREFIX));
        assert!(s.contains(&format!("ptx-sha256={}", sha256_hex(b"ptx"))));
        assert!(s.contains(&format!("cubin-sha256={}", sha256_hex(b"elf"))));
        assert!(s.contains(&format!("ptxas={PTXAS_VERSION} arch=sm_90a")));
        assert!(s.ends_with('\n'));
    }

    #[test]
    fn check_cubin_rejects_stale_or_missing_cubins() {
        // A minimal 64-byte CUDA ELF header for sm_90.
        static ELF: [u8; 64] = {
            let mut h = [0u8; 64];
            h[0] = 0x7f;
            h[1] = b'E';
            h[2] = b'L';
            h[3] = b'F';
            h[4] = 2;
            h[5] = 1;
            h[18] = 190;
            h[48] = 0x5a;
            h[49] = 0x05;
            h[50] = 0x5a;
            h
        };
        let ptx = ".version 8.4\n.target sm_90\n";
        let stamp: &'static str =
            Box::leak(cubin_stamp(ptx, &ELF, CubinArch::Sm90).into_boxed_str());
        let good = PtxModule {
            name: "t",
            ptx,
            cubin: Some(crate::gpu::Cubin {
                arch: CubinArch::Sm90,
                image: &ELF,
                stamp,
            }),
        };
        assert_eq!(check_cubin(&good), Ok(()));
        let edited = PtxModule {
            ptx: ".version 8.4\n.target sm_90\n// edited\n",
            ..good
        };
        assert!(check_cubin(&edited).unwrap_err().contains("stale"));
        let none = PtxModule {
            cubin: None,
            ..good
        };
        assert!(check_cubin(&none).unwrap_err().contains("no cubin"));
        let wrong_arch = PtxModule {
            ptx: ".version 8.4\n.target sm_90a\n",
            ..good
        };
        assert!(check_cubin(&wrong_arch)
            .unwrap_err()
            .contains("targets sm_90a"));
        assert_eq!(cubin_elf_arch(&ELF), Some((90, false)));
        assert_eq!(cubin_elf_arch(b"not an elf"), None);
    }
}
