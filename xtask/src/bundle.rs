//! `cargo xtask gpu-bundle`: release GPU test and bench binaries in one folder
//! with `run.sh`, for a GPU host that has a driver but no Rust.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// What one device call carries in all: the copy of the working tree (its
/// tracked files) plus the carried bundle.
const DEVICE_CARRY_BYTES: u64 = 64 << 20;

/// Room kept for the tracked tree: `git ls-files -z | xargs -0 du -cb` gave
/// 37,038,140 bytes (≈ 35.3 MiB, most of it committed PTX and cubins) on
/// 2026-12-03 and 42,553,438 (≈ 40.6 MiB) on 2026-12-05 with the decode
/// entries at head dim 512 and e4m3 256; 42 MiB since then (the bundle
/// packs to ≈ 18 MiB with the 256 MiB xz dictionary). Session 44 found
/// 43,368,486 bytes (0.67 MB of room) and dropped five concluded
/// experiment entries: 40,234,792. Session 52 found 43,762,705 (0.28 MB
/// of room) and left NVRTC's inline-asm marker comments out of the PTX
/// (cubins byte-identical): 41,085,120.
const TREE_ALLOWANCE_BYTES: u64 = 42 << 20;

/// Largest compressed bundle (`<out>.tar.xz`) we ship to the GPU host:
/// 64 MiB − 42 MiB = 22 MiB.
const MAX_BUNDLE_BYTES: u64 = DEVICE_CARRY_BYTES - TREE_ALLOWANCE_BYTES;

const RUN_SH: &str = r#"#!/usr/bin/env bash
# mha-kit GPU bundle: measures start-up (bin/mha-startup, JIT cache off),
# runs every GPU test binary (ignored tests included, a missing GPU is a
# failure), then every benchmark.
# usage: run.sh [LOGDIR]     env: MHA_KIT_SKIP_BENCH=1 skips the benchmarks,
#                                 MHA_KIT_TEST_ARGS extra args for test binaries
set -u
here=$(cd "$(dirname "$0")" && pwd)
logs=${1:-$here/logs}
mkdir -p "$logs"
export MHA_KIT_REQUIRE_GPU=1
passed=0
failed=0
# Start-up of a fresh process with the JIT cache off (cubins: no JIT on sm_90).
if [ -x "$here/bin/mha-startup" ]; then
  if CUDA_CACHE_DISABLE=1 "$here/bin/mha-startup" >"$logs/startup.log" 2>&1; then
    grep -E '^startup_s ' "$logs/startup.log"
  else
    echo "mha-startup failed; see $logs/startup.log"
    tail -n 20 "$logs/startup.log"
    failed=$((failed + 1))
  fi
fi
for t in "$here"/tests/*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  "$t" --include-ignored ${MHA_KIT_TEST_ARGS:-} >"$logs/$name.log" 2>&1
  rc=$?
  line=$(grep -E '^test result:' "$logs/$name.log" | tail -n 1)
  p=$(printf '%s' "$line" | sed -nE 's/.* ([0-9]+) passed.*/\1/p')
  f=$(printf '%s' "$line" | sed -nE 's/.* ([0-9]+) failed.*/\1/p')
  if [ -z "$p" ] || [ -z "$f" ]; then
    echo "$name: no test result (exit $rc); see $logs/$name.log"
    tail -n 20 "$logs/$name.log"
    failed=$((failed + 1))
    continue
  fi
  passed=$((passed + p))
  failed=$((failed + f))
  echo "$name: $line"
  [ "$f" -gt 0 ] && grep -E '^(test .* FAILED|---- )' "$logs/$name.log" | head -n 20
done
# The Python package's GPU tests, when python3 has torch.
if [ -x "$here/python/run_python.sh" ] && python3 -c "import torch" 2>/dev/null; then
  bash "$here/python/run_python.sh" "$logs" >"$logs/python.log" 2>&1
  rc=$?
  line=$(grep -E '^=+ .*(passed|failed|skipped).* =+$' "$logs/python.log" | tail -n 1)
  p=$(printf '%s' "$line" | sed -nE 's/.* ([0-9]+) passed.*/\1/p')
  f=$(printf '%s' "$line" | sed -nE 's/.* ([0-9]+) failed.*/\1/p')
  echo "python mha_kit: ${line:-no pytest summary} (exit $rc)"
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-0}))
  if [ "$rc" -ne 0 ] && [ -z "$f" ]; then failed=$((failed + 1)); tail -n 20 "$logs/python.log"; fi
fi
if [ "${MHA_KIT_SKIP_BENCH:-0}" != 1 ]; then
  # Peer scripts (torch's cuDNN SDPA on the same shapes), when python3 has torch.
  for py in "$here"/peers/*.py; do
    [ -f "$py" ] || continue
    name=$(basename "$py" .py)
    if python3 "$py" >"$logs/peer-$name.log" 2>&1; then
      grep -E '^(\||## )' "$logs/peer-$name.log"
    else
      echo "peer script $name failed; see $logs/peer-$name.log"
      tail -n 20 "$logs/peer-$name.log"
    fi
  done
  for b in "$here"/benches/*; do
    [ -x "$b" ] || continue
    name=$(basename "$b")
    if "$b" --bench >"$logs/bench-$name.log" 2>&1; then
      # The bench's own summary table (markdown lines) goes to the console.
      grep -E '^(\||## )' "$logs/bench-$name.log"
    else
      echo "bench $name failed; see $logs/bench-$name.log"
      tail -n 20 "$logs/bench-$name.log"
      failed=$((failed + 1))
    fi
  done
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
"#;

/// One built executable and its bundle name.
struct Artifact {
    exe: PathBuf,
    name: String,
    /// Bundle sub-folder: `tests`, `benches` or `bin`.
    dir: &'static str,
}

fn built_artifacts(root: &Path, args: &[&str]) -> Result<Vec<Artifact>> {
    eprintln!("$ cargo {}", args.join(" "));
    let out = Command::new("cargo")
        .args(args)
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo")?;
    if !out.status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let kind = msg["target"]["kind"][0].as_str().unwrap_or_default();
        let target = msg["target"]["name"].as_str().unwrap_or_default();
        let krate = Path::new(msg["manifest_path"].as_str().unwrap_or_default())
            .parent()
            .and_then(Path::file_name)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (dir, name) = match kind {
            "test" if target == "gpu" || target.ends_with("_gpu") => {
                ("tests", format!("{krate}-{target}"))
            }
            "bench" => ("benches", format!("{krate}-{target}")),
            "bin" if target.starts_with("mha-") => ("bin", target.to_string()),
            "example" => ("bin", target.to_string()),
            _ => continue,
        };
        found.push(Artifact {
            exe: PathBuf::from(exe),
            name,
            dir,
        });
    }
    Ok(found)
}

/// The first file under `crates/*/ptx/` (the committed PTX, cubins and
/// stamps the binaries embed) modified at or after `since`, if any.
/// Session 44 packed a bench whose build had read a new PTX beside the
/// previous cubin while `ptx-build` was still writing: the loader took the
/// cubin, which lacked the new entry.
fn ptx_changed_since(root: &Path, since: std::time::SystemTime) -> Result<Option<PathBuf>> {
    for krate in std::fs::read_dir(root.join("crates"))?.filter_map(|e| e.ok()) {
        let Ok(entries) = std::fs::read_dir(krate.path().join("ptx")) else {
            continue;
        };
        for e in entries.filter_map(|e| e.ok()) {
            if e.metadata()?.modified()? >= since {
                return Ok(Some(e.path()));
            }
        }
    }
    Ok(None)
}

/// Builds the bundle into `out`.
pub fn build(root: &Path, out: &Path) -> Result<()> {
    let out = if out.is_absolute() {
        out.to_path_buf()
    } else {
        root.join(out)
    };
    let started = std::time::SystemTime::now();
    let mut artifacts = built_artifacts(
        root,
        &[
            "test",
            "--release",
            "--workspace",
            "--no-run",
            "--tests",
            "--message-format=json-render-diagnostics",
        ],
    )?;
    artifacts.extend(built_artifacts(
        root,
        &[
            "bench",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ],
    )?);
    artifacts.extend(built_artifacts(
        root,
        &[
            "build",
            "--release",
            "--workspace",
            "--bins",
            "--examples",
            "--message-format=json-render-diagnostics",
        ],
    )?);
    if let Some(p) = ptx_changed_since(root, started)? {
        bail!(
            "{} changed while the binaries were building (a `ptx-build` running?): \
             they may embed one build's PTX with another's cubin, which the loader \
             prefers; run gpu-bundle again",
            p.display()
        );
    }
    let _ = std::fs::remove_dir_all(&out);
    for sub in ["tests", "benches", "bin", "peers"] {
        std::fs::create_dir_all(out.join(sub))?;
    }
    let mut total = 0u64;
    for a in &artifacts {
        let sub = a.dir;
        let dst = out.join(sub).join(&a.name);
        std::fs::copy(&a.exe, &dst)?;
        // Best effort: `strip` shrinks test binaries built with debug info.
        let _ = Command::new("strip").arg(&dst).status();
        total += std::fs::metadata(&dst)?.len();
        eprintln!("  {sub}/{}", a.name);
    }
    // Peer scripts: crates/*/benches/*.py.
    for krate in std::fs::read_dir(root.join("crates"))?.filter_map(|e| e.ok()) {
        let Ok(entries) = std::fs::read_dir(krate.path().join("benches")) else {
            continue;
        };
        for p in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            if p.extension().is_some_and(|x| x == "py") {
                if let Some(name) = p.file_name() {
                    std::fs::copy(&p, out.join("peers").join(name))?;
                    eprintln!("  peers/{}", name.to_string_lossy());
                }
            }
        }
    }
    let pydir = crate::python::bundle(root, &out)?;
    eprintln!("  {}", pydir.display());
    let run = out.join("run.sh");
    std::fs::write(&run, RUN_SH)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755))?;
    }
    eprintln!(
        "gpu-bundle: {} binaries, {:.1} MiB in {}",
        artifacts.len(),
        total as f64 / (1 << 20) as f64,
        out.display()
    );
    // One compressed archive that a GPU call can carry:
    // `tar -xJf <out>.tar.xz && bash <name>/run.sh LOGDIR` on the GPU host.
    let name = out
        .file_name()
        .context("bundle folder has no name")?
        .to_string_lossy()
        .into_owned();
    let parent = out.parent().context("bundle folder has no parent")?;
    let archive = parent.join(format!("{name}.tar.xz"));
    let status = Command::new("tar")
        .arg("-cJf")
        .arg(&archive)
        .arg("-C")
        .arg(parent)
        .arg(&name)
        // One thread, preset 9 with a 256 MiB dictionary: it spans several
        // binaries (each embeds the same PTX and cubins, ~30 MB, in 40 MB
        // and larger binaries), so they are stored about once (2026-12-05,
        // 669 MiB: preset 9's 64 MiB dictionary 25.2 MB, this 18.6 MB, both
        // ~4.3 min on 2 cores; about 2.7 GiB of memory to pack, 256 MiB to
        // unpack; `-T0 -6` compresses blocks apart: 53 MiB in 2026-12-02).
        .env("XZ_OPT", "--lzma2=preset=9,dict=256MiB -T1")
        .status()
        .context("cannot run tar (tar and xz are needed to pack the bundle)")?;
    if !status.success() {
        bail!("tar failed ({status})");
    }
    let packed = std::fs::metadata(&archive)?.len();
    eprintln!(
        "gpu-bundle: {} ({:.1} MiB packed)",
        archive.display(),
        packed as f64 / (1 << 20) as f64
    );
    if packed > MAX_BUNDLE_BYTES {
        bail!("packed bundle is {packed} bytes, over the {MAX_BUNDLE_BYTES}-byte limit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PTX-folder file written after the build started is found; one
    /// written before is not, nor are files outside `crates/*/ptx/`.
    #[test]
    fn ptx_written_during_the_build_is_found() {
        let root = std::env::temp_dir().join(format!("xtask-ptx-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let ptx = root.join("crates").join("k").join("ptx");
        std::fs::create_dir_all(&ptx).unwrap();
        std::fs::create_dir_all(root.join("crates").join("k").join("src")).unwrap();
        std::fs::write(ptx.join("k.ptx"), "old").unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(ptx.join("k.ptx"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        let started = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
        std::fs::write(root.join("crates").join("k").join("src").join("lib.rs"), "").unwrap();
        assert_eq!(ptx_changed_since(&root, started).unwrap(), None);
        std::fs::write(ptx.join("k.sm_90a.cubin"), "new").unwrap();
        assert_eq!(
            ptx_changed_since(&root, started).unwrap(),
            Some(ptx.join("k.sm_90a.cubin"))
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// The bundle limit still leaves room for today's tracked tree: fails
    /// when the tree outgrows `TREE_ALLOWANCE_BYTES` (then lower the limit
    /// or shrink the tree). Skipped where `git` cannot list the files.
    #[test]
    fn bundle_limit_leaves_room_for_the_tracked_tree() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let Ok(out) = Command::new("git")
            .args(["ls-files", "-z"])
            .current_dir(root)
            .output()
        else {
            return;
        };
        if !out.status.success() {
            return;
        }
        let tree: u64 = out
            .stdout
            .split(|&b| b == 0)
            .filter(|p| !p.is_empty())
            .filter_map(|p| std::fs::metadata(root.join(String::from_utf8_lossy(p).as_ref())).ok())
            .map(|m| m.len())
            .sum();
        assert!(
            tree <= TREE_ALLOWANCE_BYTES,
            "tracked tree is {tree} bytes, over the {TREE_ALLOWANCE_BYTES}-byte allowance"
        );
    }
}
