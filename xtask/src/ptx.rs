//! PTX build, freshness check and resource report.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use kernel_rt::{ptxhash, CubinArch};

/// Pinned toolchain, installed with pip from the Python package index.
const PIP_PACKAGES: [&str; 3] = [
    "nvidia-cuda-nvrtc-cu12==12.4.127",
    "nvidia-cuda-runtime-cu12==12.4.127",
    "nvidia-cuda-nvcc-cu12==12.4.131",
];
/// The version written into every PTX header line.
const TOOLCHAIN: &str = "nvrtc-12.4.127";
/// Virtual architecture of every kernel except the Hopper-only ones.
const ARCH: &str = "compute_90";
/// Virtual architecture of a `*_sm90.cu` kernel (wgmma, setmaxnreg: loads
/// only on sm_90 devices).
const ARCH_SM90A: &str = "compute_90a";

/// The virtual architecture a kernel source compiles for: `compute_90a` for
/// files named `*_sm90.cu`, else `compute_90`.
fn arch_of(src: &Path) -> &'static str {
    if src
        .file_stem()
        .is_some_and(|s| s.to_string_lossy().ends_with("_sm90"))
    {
        ARCH_SM90A
    } else {
        ARCH
    }
}

/// Where the pinned toolchain lives.
pub(crate) fn toolchain_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("cuda-toolchain")
}

/// Installs the pinned toolchain when missing; returns its folder.
fn ensure_toolchain(root: &Path) -> Result<PathBuf> {
    let dir = toolchain_dir(root);
    pip_install_pinned(
        &dir,
        "mha-kit-toolchain.txt",
        &PIP_PACKAGES,
        "the pinned CUDA toolchain",
    )?;
    Ok(dir)
}

/// Installs the pinned `packages` into `dir` with pip unless its `marker`
/// file already lists exactly them: through a staging folder renamed into
/// place, so that an interrupted install is never taken for a finished one.
/// `what` names them in messages.
pub(crate) fn pip_install_pinned(
    dir: &Path,
    marker: &str,
    packages: &[&str],
    what: &str,
) -> Result<()> {
    let marker = dir.join(marker);
    let want = packages.join("\n");
    if std::fs::read_to_string(&marker).is_ok_and(|have| have == want) {
        return Ok(());
    }
    eprintln!("installing {what} into {}", dir.display());
    let staging = dir.with_extension("partial");
    let _ = std::fs::remove_dir_all(&staging);
    let _ = std::fs::remove_dir_all(dir);
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-cache-dir",
            "--no-deps",
            "--target",
        ])
        .arg(&staging)
        .args(packages)
        .status()
        .with_context(|| {
            format!("cannot run `python3 -m pip` (Python 3 with pip is required to fetch {what})")
        })?;
    if !status.success() {
        bail!("pip failed to install {what} ({status})");
    }
    std::fs::rename(&staging, dir)?;
    std::fs::write(&marker, want)?;
    Ok(())
}

/// One `.cu` file and where its PTX goes.
pub(crate) struct Kernel {
    src: PathBuf,
    ptx: PathBuf,
}

impl Kernel {
    /// The architecture its cubin is assembled for.
    fn cubin_arch(&self) -> CubinArch {
        if arch_of(&self.src) == ARCH_SM90A {
            CubinArch::Sm90a
        } else {
            CubinArch::Sm90
        }
    }

    /// `ptx/<stem>.<sm>.cubin`, next to the PTX.
    pub(crate) fn cubin(&self) -> PathBuf {
        self.ptx
            .with_extension(format!("{}.cubin", self.cubin_arch().name()))
    }

    /// `ptx/<stem>.<sm>.cubin.stamp`.
    fn stamp(&self) -> PathBuf {
        self.ptx
            .with_extension(format!("{}.cubin.stamp", self.cubin_arch().name()))
    }
}

pub(crate) fn kernels(root: &Path) -> Result<Vec<Kernel>> {
    let mut out = Vec::new();
    let mut crates: Vec<_> = std::fs::read_dir(root.join("crates"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    crates.sort();
    for krate in crates {
        let dir = krate.join("kernels");
        if !dir.is_dir() {
            continue;
        }
        let mut files: Vec<_> = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "cu"))
            .collect();
        files.sort();
        for src in files {
            let stem = src.file_stem().unwrap_or_default().to_owned();
            let ptx = krate.join("ptx").join(stem).with_extension("ptx");
            out.push(Kernel { src, ptx });
        }
    }
    Ok(out)
}

fn include_dir(root: &Path) -> PathBuf {
    root.join("crates/kernel-rt/include")
}

/// `cargo xtask ptx-build [--check]`: PTX with NVRTC, then the cubins with
/// ptxas (see [`assemble_cubins`]).
pub fn build(root: &Path, check: bool) -> Result<()> {
    build_and_assemble(root, check).map(|_| ())
}

/// `ptx-build --check` followed by `ptx-report`, assembling every PTX once
/// (what `cargo xtask ci` runs).
pub fn check_and_report(root: &Path) -> Result<()> {
    let logs = build_and_assemble(root, true)?;
    print_report(&logs)
}

/// The PTX step, then [`assemble_cubins`]; returns each kernel's `ptxas -v`
/// log.
fn build_and_assemble(root: &Path, check: bool) -> Result<Vec<(String, String)>> {
    let tc = ensure_toolchain(root)?;
    let kernels = kernels(root)?;
    // One scratch folder per process: concurrent builds must not share files.
    let scratch = toolchain_dir(root).with_file_name(format!("ptx-scratch-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let mut jobs = Vec::new();
    for (i, k) in kernels.iter().enumerate() {
        let files = ptxhash::source_closure(&k.src, &[include_dir(root)])?;
        let sha = ptxhash::hash_files(root, &files)?;
        let out = if check {
            scratch.join(format!("{i}.ptx"))
        } else {
            k.ptx.clone()
        };
        if let Some(parent) = out.parent() {
            std::fs::create_dir_all(parent)?;
        }
        jobs.push(serde_json::json!({
            "src": k.src,
            "out": out,
            "header": ptxhash::header_line(&sha, TOOLCHAIN, arch_of(&k.src)),
        }));
    }
    let jobs_file = scratch.join("jobs.json");
    std::fs::write(&jobs_file, serde_json::to_vec(&jobs)?)?;

    // cudarc finds libnvrtc only through the loader's search path, which is
    // read at process start: compile in a child with LD_LIBRARY_PATH set.
    let lib = tc.join("nvidia/cuda_nvrtc/lib");
    let ld = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(old) => {
            let mut v = lib.clone().into_os_string();
            v.push(":");
            v.push(old);
            v
        }
        None => lib.into_os_string(),
    };
    let status = Command::new(std::env::current_exe()?)
        .arg("nvrtc-compile")
        .arg(&jobs_file)
        .env("LD_LIBRARY_PATH", ld)
        .env(
            "MHA_KIT_CUDA_INCLUDE",
            tc.join("nvidia/cuda_runtime/include"),
        )
        .current_dir(root)
        .status()?;
    if !status.success() {
        bail!("PTX compilation failed");
    }

    let result = if check {
        compare(root, &kernels, &scratch)
            .and_then(|()| assemble_cubins(root, &tc, &kernels, Some(&scratch)))
    } else {
        eprintln!("ptx-build: wrote {} PTX file(s)", kernels.len());
        assemble_cubins(root, &tc, &kernels, None)
    };
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// The pinned ptxas, made executable (pip does not keep the mode bit
/// everywhere) and checked to be [`ptxhash::PTXAS_VERSION`].
fn ptxas(tc: &Path) -> Result<PathBuf> {
    let ptxas = tc.join("nvidia/cuda_nvcc/bin/ptxas");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mut perm = std::fs::metadata(&ptxas)
            .with_context(|| format!("{} missing", ptxas.display()))?
            .permissions();
        if perm.mode() & 0o111 == 0 {
            perm.set_mode(0o755);
            std::fs::set_permissions(&ptxas, perm)?;
        }
    }
    let out = Command::new(&ptxas)
        .arg("--version")
        .output()
        .with_context(|| format!("cannot run {}", ptxas.display()))?;
    let version = String::from_utf8_lossy(&out.stdout);
    if !version.contains(&format!("V{}", ptxhash::PTXAS_VERSION)) {
        bail!(
            "{} is not ptxas {}:\n{version}",
            ptxas.display(),
            ptxhash::PTXAS_VERSION
        );
    }
    Ok(ptxas)
}

/// Runs `ptxas -v -arch=<sm> -o <out> <ptx>` for every job on all cores;
/// returns each job's log (stderr) in job order.
fn run_ptxas(ptxas: &Path, jobs: &[(PathBuf, CubinArch, PathBuf)]) -> Result<Vec<String>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len().max(1));
    let mut logs: Vec<Option<Result<String>>> = (0..jobs.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((ptx, arch, out)) = jobs.get(i) else {
                            return done;
                        };
                        let res = Command::new(ptxas)
                            .args(["-arch", arch.name(), "-v", "-o"])
                            .arg(out)
                            .arg(ptx)
                            .output()
                            .with_context(|| format!("cannot run {}", ptxas.display()))
                            .and_then(|o| {
                                let log = String::from_utf8_lossy(&o.stderr).into_owned();
                                if o.status.success() {
                                    Ok(log)
                                } else {
                                    bail!("ptxas failed on {}:\n{log}", ptx.display())
                                }
                            });
                        done.push((i, res));
                    }
                })
            })
            .collect();
        for w in workers {
            for (i, res) in w.join().expect("ptxas worker panicked") {
                logs[i] = Some(res);
            }
        }
    });
    logs.into_iter()
        .map(|l| l.context("ptxas job not run")?)
        .collect()
}

/// Assembles every committed PTX into its cubin (`ptxas -arch=sm_90`, or
/// `sm_90a` for the `compute_90a` kernels) and writes the stamp
/// ([`ptxhash::cubin_stamp`]). With `scratch` (`--check`) the cubins go
/// there and are compared byte for byte, with their stamps, against the
/// committed ones; any cubin or stamp without a PTX is reported too.
/// Returns (PTX file name, `ptxas -v` log) per kernel.
fn assemble_cubins(
    root: &Path,
    tc: &Path,
    kernels: &[Kernel],
    scratch: Option<&Path>,
) -> Result<Vec<(String, String)>> {
    let ptxas = ptxas(tc)?;
    let jobs: Vec<_> = kernels
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let out = match scratch {
                Some(dir) => dir.join(format!("{i}.cubin")),
                None => k.cubin(),
            };
            (k.ptx.clone(), k.cubin_arch(), out)
        })
        .collect();
    let logs = run_ptxas(&ptxas, &jobs)?;
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    let mut stale = Vec::new();
    let mut bytes = 0u64;
    for (k, (_, arch, out)) in kernels.iter().zip(&jobs) {
        let ptx = std::fs::read_to_string(&k.ptx)?;
        let cubin = std::fs::read(out)?;
        bytes += cubin.len() as u64;
        let stamp = ptxhash::cubin_stamp(&ptx, &cubin, *arch);
        if scratch.is_some() {
            if std::fs::read(k.cubin()).ok().as_deref() != Some(&cubin[..]) {
                stale.push(rel(&k.cubin()));
            }
            if std::fs::read_to_string(k.stamp()).ok().as_deref() != Some(&stamp[..]) {
                stale.push(rel(&k.stamp()));
            }
        } else {
            std::fs::write(k.stamp(), stamp)?;
        }
    }
    if scratch.is_some() {
        let known: Vec<PathBuf> = kernels
            .iter()
            .flat_map(|k| [k.cubin(), k.stamp()])
            .collect();
        for krate in std::fs::read_dir(root.join("crates"))?.filter_map(|e| e.ok()) {
            let Ok(entries) = std::fs::read_dir(krate.path().join("ptx")) else {
                continue;
            };
            for p in entries.filter_map(|e| e.ok().map(|e| e.path())) {
                let name = p.to_string_lossy();
                if (name.ends_with(".cubin") || name.ends_with(".cubin.stamp"))
                    && !known.contains(&p)
                {
                    stale.push(format!("{} (no PTX)", rel(&p)));
                }
            }
        }
        if !stale.is_empty() {
            bail!(
                "stale cubins (run `cargo xtask ptx-build` and commit):\n  {}",
                stale.join("\n  ")
            );
        }
        eprintln!(
            "ptx-build --check: {} cubin(s) up to date ({bytes} bytes)",
            kernels.len()
        );
    } else {
        eprintln!(
            "ptx-build: wrote {} cubin(s), {bytes} bytes (ptxas {})",
            kernels.len(),
            ptxhash::PTXAS_VERSION
        );
    }
    Ok(kernels
        .iter()
        .zip(logs)
        .map(|(k, log)| {
            let file = k.ptx.file_name().unwrap_or_default().to_string_lossy();
            (file.into_owned(), log)
        })
        .collect())
}

/// Compares the PTX rebuilt into `scratch` with the committed files.
fn compare(root: &Path, kernels: &[Kernel], scratch: &Path) -> Result<()> {
    let mut stale = Vec::new();
    for (i, k) in kernels.iter().enumerate() {
        let fresh = std::fs::read_to_string(scratch.join(format!("{i}.ptx")))?;
        let committed = std::fs::read_to_string(&k.ptx).unwrap_or_default();
        if fresh != committed {
            stale.push(
                k.ptx
                    .strip_prefix(root)
                    .unwrap_or(&k.ptx)
                    .display()
                    .to_string(),
            );
        }
    }
    let known: Vec<PathBuf> = kernels.iter().map(|k| k.ptx.clone()).collect();
    for krate in std::fs::read_dir(root.join("crates"))?.filter_map(|e| e.ok()) {
        let Ok(entries) = std::fs::read_dir(krate.path().join("ptx")) else {
            continue;
        };
        for p in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            if p.extension().is_some_and(|x| x == "ptx") && !known.contains(&p) {
                stale.push(format!(
                    "{} (no source)",
                    p.strip_prefix(root).unwrap_or(&p).display()
                ));
            }
        }
    }
    if !stale.is_empty() {
        bail!(
            "stale PTX (run `cargo xtask ptx-build` and commit):\n  {}",
            stale.join("\n  ")
        );
    }
    eprintln!(
        "ptx-build --check: {} PTX file(s) up to date",
        kernels.len()
    );
    Ok(())
}

/// The child process of [`build`]: compiles each job with NVRTC.
pub fn nvrtc_child(root: &Path, jobs_file: &Path) -> Result<()> {
    let jobs: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(jobs_file)?)?;
    let cuda_include =
        std::env::var("MHA_KIT_CUDA_INCLUDE").context("MHA_KIT_CUDA_INCLUDE unset")?;
    // SAFETY: only probes whether libnvrtc can be loaded.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        bail!("libnvrtc not found in LD_LIBRARY_PATH (toolchain install incomplete?)");
    }
    let mut failed = false;
    for job in jobs {
        let src = PathBuf::from(job["src"].as_str().context("job.src")?);
        let out = PathBuf::from(job["out"].as_str().context("job.out")?);
        let header = job["header"].as_str().context("job.header")?;
        let text = std::fs::read_to_string(&src)?;
        let name = src
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let opts = cudarc::nvrtc::CompileOptions {
            arch: Some(arch_of(&src)),
            include_paths: vec![
                include_dir(root).to_string_lossy().into_owned(),
                src.parent().unwrap_or(root).to_string_lossy().into_owned(),
                cuda_include.clone(),
            ],
            options: vec!["-std=c++17".into(), "-DMHA_KIT_NVRTC=1".into()],
            name: Some(name.clone()),
            ..Default::default()
        };
        match cudarc::nvrtc::compile_ptx_with_opts(&text, opts) {
            Ok(ptx) => {
                let body = strip_asm_markers(ptx.to_src().trim_end_matches('\0'));
                std::fs::write(&out, format!("{header}\n{body}"))?;
            }
            Err(e) => {
                failed = true;
                let log = match &e {
                    cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                        log.to_string_lossy().into_owned()
                    }
                    other => format!("{other:?}"),
                };
                eprintln!("error: NVRTC failed on {}:\n{log}", src.display());
            }
        }
    }
    if failed {
        bail!("NVRTC compilation failed");
    }
    Ok(())
}

/// NVRTC's PTX with the comment lines it writes around every inline-asm
/// statement (`// begin inline asm`, `// end inline asm`) left out: ~20 % of
/// the committed PTX by lines, ~2.6 MB over the tree (space the device
/// carry limit counts), and nothing ptxas reads (the cubins assembled from
/// the PTX with and without them are byte-identical). Every other line is
/// kept as written.
fn strip_asm_markers(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    for line in ptx.split_inclusive('\n') {
        let t = line.trim();
        if t == "// begin inline asm" || t == "// end inline asm" {
            continue;
        }
        out.push_str(line);
    }
    out
}

/// Per-kernel resources parsed from `ptxas -v`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Resources {
    /// Entry point name.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory, bytes.
    pub smem: u32,
    /// Stack frame, bytes.
    pub stack: u32,
    /// Spill stores, bytes.
    pub spill_stores: u32,
    /// Spill loads, bytes.
    pub spill_loads: u32,
}

fn number_before(s: &str, unit: &str) -> Option<u32> {
    let idx = s.find(unit)?;
    s[..idx].split_whitespace().last()?.parse().ok()
}

/// Parses `ptxas -v` output into one row per entry point.
pub fn parse_ptxas(log: &str) -> Vec<Resources> {
    let mut out: Vec<Resources> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(Resources {
                name,
                ..Default::default()
            });
        } else if let Some(cur) = out.last_mut() {
            if line.contains("bytes stack frame") {
                cur.stack = number_before(line, "bytes stack frame").unwrap_or(0);
                cur.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                cur.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used") && line.contains("registers") {
                cur.registers = number_before(line, "registers").unwrap_or(0);
                cur.smem = number_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

/// The kernels whose every wgmma ptxas serialized, from a `ptxas -v` log: its
/// "Potential Performance Loss: wgmma.mma_async instructions are serialized
/// due to …" advisories (C7514: a control-flow merge while a wgmma is in
/// flight; C7515: non-wgmma instructions defining accumulator registers in a
/// pipeline stage, session 43; the others of that family name other
/// causes), each naming its function in quotes at the end.
pub fn serialized_wgmma(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("wgmma.mma_async instructions are serialized"))
        .map(|l| l.rsplit('\'').nth(1).unwrap_or(l).to_string())
        .collect()
}

/// `cargo xtask ptx-report`.
pub fn report(root: &Path) -> Result<()> {
    let tc = ensure_toolchain(root)?;
    let ptxas = ptxas(&tc)?;
    let kernels = kernels(root)?;
    let jobs: Vec<_> = kernels
        .iter()
        .map(|k| (k.ptx.clone(), k.cubin_arch(), PathBuf::from("/dev/null")))
        .collect();
    let logs = run_ptxas(&ptxas, &jobs)?;
    let named: Vec<(String, String)> = kernels
        .iter()
        .zip(logs)
        .map(|(k, log)| {
            let file = k.ptx.file_name().unwrap_or_default().to_string_lossy();
            (file.into_owned(), log)
        })
        .collect();
    print_report(&named)
}

/// Prints the resource table of (PTX file name, `ptxas -v` log) pairs; fails
/// on any spill or serialized wgmma.
fn print_report(logs: &[(String, String)]) -> Result<()> {
    let mut table = String::new();
    writeln!(
        table,
        "| PTX | kernel | regs | smem B | stack B | spill st B | spill ld B |\n|---|---|---:|---:|---:|---:|---:|"
    )?;
    let mut spills = Vec::new();
    let mut serialized = Vec::new();
    for (file, log) in logs {
        serialized.extend(serialized_wgmma(log));
        for r in parse_ptxas(log) {
            writeln!(
                table,
                "| {file} | {} | {} | {} | {} | {} | {} |",
                r.name, r.registers, r.smem, r.stack, r.spill_stores, r.spill_loads
            )?;
            if r.spill_stores > 0 || r.spill_loads > 0 {
                spills.push(r.name.clone());
            }
        }
    }
    println!("{table}");
    if !spills.is_empty() {
        bail!("register spills in: {}", spills.join(", "));
    }
    if !serialized.is_empty() {
        bail!(
            "ptxas serializes the wgmma instructions in: {}",
            serialized.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxas_verbose_output() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'page_table_build' for 'sm_90'\n\
ptxas info    : Function properties for page_table_build\n\
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 24 registers, 1024 bytes smem, 400 bytes cmem[0]\n";
        let r = parse_ptxas(log);
        assert_eq!(
            r,
            vec![Resources {
                name: "page_table_build".into(),
                registers: 24,
                smem: 1024,
                stack: 8,
                spill_stores: 4,
                spill_loads: 12,
            }]
        );
    }

    #[test]
    fn serialized_wgmma_advisories_name_their_kernels() {
        let log = "ptxas info    : Compiling entry function 'k_ok' for 'sm_90a'\n\
ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized \
due to non wgmma instructions defining accumulator registers of a wgmma between start and end of \
the pipeline stage in the function 'k_a'\n\
ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized \
due to the presence of control flow in the function 'k_b'\n\
ptxas info    : Used 168 registers\n";
        assert_eq!(
            serialized_wgmma(log),
            vec!["k_a".to_string(), "k_b".to_string()]
        );
        assert!(serialized_wgmma("ptxas info    : Used 24 registers\n").is_empty());
    }

    #[test]
    fn asm_marker_lines_are_dropped_and_nothing_else() {
        let ptx = "\t// begin inline asm\n\tmov.u32 %r1, %r2;\n\t// end inline asm\n\
\t// .globl\tk\n\t// begin inline asm x\n\tret;";
        assert_eq!(
            strip_asm_markers(ptx),
            "\tmov.u32 %r1, %r2;\n\t// .globl\tk\n\t// begin inline asm x\n\tret;"
        );
        assert_eq!(strip_asm_markers(""), "");
    }

    #[test]
    fn pinned_nvcc_wheel_is_the_stamped_ptxas() {
        let want = format!("nvidia-cuda-nvcc-cu12=={}", ptxhash::PTXAS_VERSION);
        assert!(PIP_PACKAGES.contains(&want.as_str()), "{want}");
    }

    #[test]
    fn cubin_paths_sit_next_to_the_ptx() {
        let k = Kernel {
            src: PathBuf::from("crates/x/kernels/a_sm90.cu"),
            ptx: PathBuf::from("crates/x/ptx/a_sm90.ptx"),
        };
        assert_eq!(k.cubin(), PathBuf::from("crates/x/ptx/a_sm90.sm_90a.cubin"));
        assert_eq!(
            k.stamp(),
            PathBuf::from("crates/x/ptx/a_sm90.sm_90a.cubin.stamp")
        );
        let k = Kernel {
            src: PathBuf::from("crates/x/kernels/a.cu"),
            ptx: PathBuf::from("crates/x/ptx/a.ptx"),
        };
        assert_eq!(k.cubin(), PathBuf::from("crates/x/ptx/a.sm_90.cubin"));
    }
}
