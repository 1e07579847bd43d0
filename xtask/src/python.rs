//! The Python package (`crates/mha-kit-py`): wheel build with maturin in a
//! private virtual environment (`target/py-venv`), its CPU tests for
//! `xtask ci`, and the wheel + GPU tests for the GPU bundle.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::run;

/// What the venv needs: the build backend, the CPU tests' dependencies.
const CI_PACKAGES: &[&str] = &["maturin>=1.9,<2", "numpy", "ml_dtypes", "pytest"];

/// Pure-Python wheels the GPU host gets with the bundle (pytest and its
/// dependencies), plus ml_dtypes for CPython 3.12 (the GPU host's Python).
const BUNDLE_WHEELS: &[&str] = &["pytest", "pluggy", "iniconfig", "packaging", "pygments"];

fn crate_dir(root: &Path) -> PathBuf {
    root.join("crates/mha-kit-py")
}

/// `python -m pip install`, quiet, without pip's wheel cache: the cache
/// would hold a second copy of every download on a disk CI shares.
const PIP_INSTALL: [&str; 6] = [
    "-m",
    "pip",
    "install",
    "-q",
    "--disable-pip-version-check",
    "--no-cache-dir",
];

/// The venv's python, created (and its packages installed) on first use.
fn venv_python(root: &Path) -> Result<PathBuf> {
    let venv = root.join("target/py-venv");
    let py = venv.join("bin/python");
    if !py.exists() {
        let venv_s = venv.to_string_lossy().into_owned();
        run(root, "python3", &["-m", "venv", &venv_s])?;
    }
    let py_s = py.to_string_lossy().into_owned();
    let mut args = PIP_INSTALL.to_vec();
    args.extend_from_slice(CI_PACKAGES);
    run(root, &py_s, &args)?;
    Ok(py)
}

/// Builds the abi3 wheel into `out` (emptied first) and returns its path.
/// `portable` asks maturin for a manylinux_2_28 wheel linked with zig
/// (the `ziglang` package, installed into the venv), so that it installs on
/// a GPU host with an older glibc than this machine's.
fn build_wheel(root: &Path, py: &Path, out: &Path, portable: bool) -> Result<PathBuf> {
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out)?;
    let maturin = py.with_file_name("maturin");
    let maturin_s = maturin.to_string_lossy().into_owned();
    let out_s = out.to_string_lossy().into_owned();
    let mut args = vec!["build", "--release", "-o", &out_s];
    if portable {
        let py_s = py.to_string_lossy().into_owned();
        run(
            root,
            &py_s,
            &[PIP_INSTALL.as_slice(), &["ziglang"]].concat(),
        )?;
        args.extend_from_slice(&["--zig", "--compatibility", "manylinux_2_28"]);
    }
    // maturin finds the venv through VIRTUAL_ENV (and zig through its python).
    eprintln!("$ {maturin_s} {}", args.join(" "));
    let venv = py.parent().and_then(Path::parent).context("venv layout")?;
    let path = format!(
        "{}:{}",
        py.parent().context("venv layout")?.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let status = Command::new(&maturin)
        .args(&args)
        .current_dir(crate_dir(root))
        .env("VIRTUAL_ENV", venv)
        .env("PATH", path)
        .status()
        .context("cannot start maturin")?;
    if !status.success() {
        bail!("maturin build failed ({status})");
    }
    std::fs::read_dir(out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .context("maturin wrote no wheel")
}

/// CI: build the wheel, install it into the venv, run the CPU pytest
/// (`crates/mha-kit-py/tests`; the GPU tests report themselves skipped).
pub fn ci(root: &Path) -> Result<()> {
    let t0 = Instant::now();
    let py = venv_python(root)?;
    let t1 = Instant::now();
    let wheel = build_wheel(root, &py, &root.join("target/wheels/ci"), false)?;
    let t2 = Instant::now();
    let py_s = py.to_string_lossy().into_owned();
    let wheel_s = wheel.to_string_lossy().into_owned();
    run(
        root,
        &py_s,
        &[
            PIP_INSTALL.as_slice(),
            &["--no-deps", "--force-reinstall", &wheel_s],
        ]
        .concat(),
    )?;
    // Run from the tests folder so that `import mha_kit` is the installed wheel.
    let tests = crate_dir(root).join("tests");
    let tests_s = tests.to_string_lossy().into_owned();
    run(
        &tests,
        &py_s,
        &[
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            &tests_s,
        ],
    )?;
    eprintln!(
        "python package: venv {:.1} s, wheel {:.1} s, install + pytest {:.1} s",
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64(),
        t2.elapsed().as_secs_f64()
    );
    Ok(())
}

const RUN_PYTHON_SH: &str = r#"#!/usr/bin/env bash
# mha_kit's GPU pytest on the GPU host (torch + driver, no Rust, no internet):
# installs the bundled wheel (and pytest / ml_dtypes when missing) into a
# private folder with pip --no-deps, then runs tests/test_gpu.py.
# usage: run_python.sh [LOGDIR]      (python3 must have torch and numpy)
set -u
here=$(cd "$(dirname "$0")" && pwd)
logs=${1:-$here/logs}
mkdir -p "$logs"
site="$logs/py-site"
rm -rf "$site" && mkdir -p "$site"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$here"/mha_kit-*.whl || exit 1
for pkg in pytest ml_dtypes; do
  if ! python3 -c "import $pkg" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
      --find-links "$here/wheels" pytest pluggy iniconfig packaging pygments ml_dtypes 2>/dev/null ||
      python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
        "$here"/wheels/*-py3-none-any.whl
    break
  fi
done
cd "$here/tests"
PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" MHA_KIT_REQUIRE_GPU=1 \
  python3 -m pytest -v -rs -p no:cacheprovider -s . 2>&1 | tee "$logs/python-gpu.log"
exit "${PIPESTATUS[0]}"
"#;

/// Adds `python/` to the bundle: the portable wheel, the GPU tests, the peer
/// bench, pytest's wheels and `run_python.sh`. Returns the folder.
pub fn bundle(root: &Path, out: &Path) -> Result<PathBuf> {
    let py = venv_python(root)?;
    let dir = out.join("python");
    let portable = build_wheel(root, &py, &dir, true);
    if let Err(e) = &portable {
        eprintln!("gpu-bundle: portable (zig) wheel build failed ({e:#}); building a native one");
        build_wheel(root, &py, &dir, false)?;
    }
    std::fs::create_dir_all(dir.join("tests"))?;
    // The GPU tests, and the CPU tests that need torch (the DLPack exchange
    // path reads torch CPU tensors; the GPU host has torch, CI does not).
    for f in [
        "test_gpu.py",
        "test_exchange.py",
        "test_backend.py",
        "test_peer_bench.py",
        "reference.py",
    ] {
        std::fs::copy(
            crate_dir(root).join("tests").join(f),
            dir.join("tests").join(f),
        )?;
    }
    // The bench beside cuDNN / FlashInfer (`gpu-context.sh` stage `pybench`;
    // test_peer_bench.py imports it from ../bench).
    std::fs::create_dir_all(dir.join("bench"))?;
    std::fs::copy(
        crate_dir(root).join("bench").join("peer_bench.py"),
        dir.join("bench").join("peer_bench.py"),
    )?;
    let wheels = dir.join("wheels");
    std::fs::create_dir_all(&wheels)?;
    let py_s = py.to_string_lossy().into_owned();
    let wheels_s = wheels.to_string_lossy().into_owned();
    let mut args = vec![
        "-m",
        "pip",
        "download",
        "-q",
        "--disable-pip-version-check",
        "--no-deps",
        "-d",
        &wheels_s,
    ];
    args.extend_from_slice(BUNDLE_WHEELS);
    if run(root, &py_s, &args).is_err() {
        eprintln!("gpu-bundle: no pytest wheels (offline?); the GPU host needs its own pytest");
    }
    let ml = [
        "-m",
        "pip",
        "download",
        "-q",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--python-version",
        "3.12",
        "--platform",
        "manylinux_2_28_x86_64",
        "-d",
        &wheels_s,
        "ml_dtypes",
    ];
    if run(root, &py_s, &ml).is_err() {
        eprintln!("gpu-bundle: no ml_dtypes wheel; the FP8 write test will be skipped");
    }
    let sh = dir.join("run_python.sh");
    std::fs::write(&sh, RUN_PYTHON_SH)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sh, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(dir)
}
