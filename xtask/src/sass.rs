//! `cargo xtask sass FUNCTION`: the SASS of one kernel entry of the committed
//! cubins, printed by `cuobjdump -sass` (the CUDA 13 cuobjdump from the
//! Python package index, installed into `target/cuda-sass-tools/` when
//! missing; not part of the build toolchain, so CI never fetches it). For
//! reading ptxas's schedule (where a barrier, a wgmma wait or a MUFU landed)
//! on a machine without a GPU.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::ptx;

/// Pinned cuobjdump and the nvdisasm it runs (they read sm_90 / sm_90a
/// cubins).
const SASS_PACKAGES: [&str; 2] = [
    "nvidia-cuda-cuobjdump==13.5.37",
    "nvidia-cuda-nvdisasm==13.5.37",
];

/// Installs the pinned cuobjdump when missing; returns the binary.
fn ensure_cuobjdump(root: &Path) -> Result<PathBuf> {
    let dir = ptx::toolchain_dir(root).with_file_name("cuda-sass-tools");
    ptx::pip_install_pinned(
        &dir,
        "mha-kit-sass-tools.txt",
        &SASS_PACKAGES,
        "cuobjdump and nvdisasm",
    )?;
    let bin = dir.join("nvidia/cu13/bin/cuobjdump");
    if !bin.is_file() {
        bail!("{} is missing after the install", bin.display());
    }
    Ok(bin)
}

/// Prints the SASS of `function` from the committed cubin that holds it.
pub fn run(root: &Path, function: &str) -> Result<()> {
    let cuobjdump = ensure_cuobjdump(root)?;
    for k in ptx::kernels(root)? {
        let cubin = k.cubin();
        let Ok(bytes) = std::fs::read(&cubin) else {
            continue;
        };
        // The entry's symbol, NUL-terminated in the string table.
        let mut sym = function.as_bytes().to_vec();
        sym.push(0);
        if !bytes.windows(sym.len()).any(|w| w == sym.as_slice()) {
            continue;
        }
        // cuobjdump runs the nvdisasm beside it.
        let status = Command::new(&cuobjdump)
            .env("NVDISASM_PATH", cuobjdump.with_file_name("nvdisasm"))
            .args(["-sass", "-fun", function])
            .arg(&cubin)
            .status()
            .with_context(|| format!("cannot run {}", cuobjdump.display()))?;
        if !status.success() {
            bail!("cuobjdump failed on {} ({status})", cubin.display());
        }
        return Ok(());
    }
    bail!("no committed cubin holds a function named `{function}`")
}
