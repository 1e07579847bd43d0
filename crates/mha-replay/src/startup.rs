//! Start-up cost on the GPU: how long a fresh process takes to open the
//! device, to reach its first decode output through [`mha_backend`], and to
//! load every kernel family's module (`mha-startup` prints it; run it with
//! `CUDA_CACHE_DISABLE=1`, which the binary sets when unset, so that the
//! driver's JIT cache cannot hide a PTX compilation).
//!
//! On a compute capability 9.0 device every module loads from its embedded
//! cubin ([`kernel_rt::ModuleSource::Cubin`]) and nothing is JIT-compiled;
//! `MHA_KIT_MODULE_LOAD=ptx` forces the PTX to measure the JIT cost.

use std::sync::Arc;
use std::time::Instant;

use kernel_rt::{Gpu, ModuleSource, PtxModule};
use mha_backend::{BackendConfig, Device, ForwardBatch, LayerConfig, MhaBackend, TensorRef};

use crate::error::{ReplayError, Result};

/// Every kernel module of the workspace, with the crate that embeds it.
pub fn all_modules() -> &'static [(&'static str, PtxModule)] {
    // A static, not an array built per call: each use of a `PtxModule`
    // constant may carry its own copy of the embedded PTX and cubin bytes.
    static MODULES: [(&str, PtxModule); 11] = [
        ("kernel-rt", kernel_rt::timing::PTX),
        ("page-table", page_table::PTX),
        ("swa-pool", swa_pool::PTX),
        ("graph-metadata", graph_metadata::PTX),
        ("graph-metadata", graph_metadata::UNFUSED_PTX),
        ("fp8-kv", fp8_kv::PTX),
        ("paged-attention", paged_attention::PTX),
        ("paged-attention", paged_attention::CONTEXT_PTX),
        ("paged-attention", paged_attention::CONTEXT_SM90_PTX),
        ("paged-attention", paged_attention::MERGE_PTX),
        ("mha-replay", crate::launch::PTX),
    ];
    &MODULES
}

/// What loading one module cost.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleTime {
    /// Module name (the kernel family).
    pub name: &'static str,
    /// Where its code came from; `None` when it did not load on this
    /// device (the sm_90a module elsewhere than on 9.0).
    pub source: Option<ModuleSource>,
    /// Whether an earlier step (the first decode) had loaded it already.
    pub already_loaded: bool,
    /// Kernel entry points resolved.
    pub entries: usize,
    /// Wall seconds to load the module and resolve every entry.
    pub seconds: f64,
    /// The load error, when it failed.
    pub error: Option<String>,
}

/// Wall seconds of the first decode pass of a fresh backend on `gpu`'s
/// device: builds an [`MhaBackend`] on the CUDA executor (one dense bf16
/// layer, 32 query / 8 KV heads, head dim 128, pages of 16 tokens), writes
/// one token's K/V and runs decode attention for it, and copies the output
/// back to the host (which waits for the device).
///
/// # Errors
/// [`ReplayError::Backend`] when any step fails; [`ReplayError::Internal`]
/// when the output is not finite.
pub fn first_decode(gpu: &Arc<Gpu>) -> Result<f64> {
    let t = Instant::now();
    let (hq, hkv, d) = (32, 8, 128);
    let mut config = BackendConfig::dense(1, LayerConfig::new(hq, hkv, d), 16, 256, 64, 4);
    config.workspace_bytes = Some(64 << 20);
    let mut b = MhaBackend::new(config, Device::Cuda(gpu.context().ordinal()))?;
    let req = b.alloc_request()?;
    let slots = b.alloc_tokens(&[(req, 1)])?;
    let batch = ForwardBatch::decode(vec![req as i64], vec![1], slots);
    b.init_forward_metadata(&batch)?;
    let one = half::bf16::from_f32(0.5).to_bits();
    let q = vec![one; hq * d];
    let kv = vec![one; hkv * d];
    let out = b.forward(
        0,
        TensorRef::Host(&q),
        Some(TensorRef::Host(&kv)),
        Some(TensorRef::Host(&kv)),
        &batch,
        true,
    )?;
    let host = out.to_host()?;
    let seconds = t.elapsed().as_secs_f64();
    // One key: the output is that key's value row, 0.5 everywhere.
    let off = host
        .iter()
        .any(|&x| (half::bf16::from_bits(x).to_f32() - 0.5).abs() > 1e-2);
    if host.len() != hq * d || off {
        return Err(ReplayError::Internal(
            "the start-up decode pass did not return its single value row".into(),
        ));
    }
    Ok(seconds)
}

/// Loads every module of [`all_modules`] on `gpu` (each entry point through
/// [`Gpu::function`]) and times each; modules that do not load (the sm_90a
/// module on another architecture) are reported, not failed.
pub fn load_all(gpu: &Gpu) -> Vec<ModuleTime> {
    all_modules()
        .iter()
        .map(|(_, m)| {
            let already_loaded = gpu.module_source(m.name).is_some();
            let t = Instant::now();
            let mut entries = 0;
            let mut error = None;
            for e in m.entries() {
                match gpu.function(m, e) {
                    Ok(_) => entries += 1,
                    Err(err) => {
                        error = Some(err.to_string());
                        break;
                    }
                }
            }
            ModuleTime {
                name: m.name,
                source: gpu.module_source(m.name),
                already_loaded,
                entries,
                seconds: t.elapsed().as_secs_f64(),
                error,
            }
        })
        .collect()
}

/// The source [`Gpu::function`] is expected to load `module` from on `gpu`:
/// its cubin when the handle loads cubins and the device runs it, else the
/// PTX.
pub fn expected_source(gpu: &Gpu, module: &PtxModule) -> ModuleSource {
    match (module.cubin, gpu.compute_capability()) {
        (Some(c), Some(cc))
            if gpu.module_load() == kernel_rt::ModuleLoad::Auto && c.arch.runs_on(cc) =>
        {
            ModuleSource::Cubin(c.arch)
        }
        _ => ModuleSource::Ptx,
    }
}

/// Whether `module` is compute_90a code (its cubin is `sm_90a`) on a device
/// other than compute capability 9.0, where neither its cubin nor its PTX
/// loads: [`load_all`] reports its error, which is then expected.
pub fn sm90a_elsewhere(gpu: &Gpu, module: &PtxModule) -> bool {
    module
        .cubin
        .is_some_and(|c| c.arch == kernel_rt::CubinArch::Sm90a)
        && gpu.compute_capability() != Some((9, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list covers every committed PTX file of the workspace, and every
    /// module carries a fresh cubin.
    #[test]
    fn all_modules_lists_every_committed_ptx_with_its_cubin() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut on_disk = Vec::new();
        for krate in std::fs::read_dir(root.join("crates")).unwrap() {
            let dir = krate.unwrap().path();
            let Ok(files) = std::fs::read_dir(dir.join("ptx")) else {
                continue;
            };
            let krate = dir.file_name().unwrap().to_string_lossy().into_owned();
            for f in files {
                let p = f.unwrap().path();
                if p.extension().is_some_and(|x| x == "ptx") {
                    let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
                    on_disk.push((krate.clone(), stem));
                }
            }
        }
        on_disk.sort();
        let mut listed: Vec<_> = all_modules()
            .iter()
            .map(|(k, m)| (k.to_string(), m.name.to_string()))
            .collect();
        listed.sort();
        assert_eq!(listed, on_disk);
        for (_, m) in all_modules() {
            kernel_rt::ptxhash::check_cubin(m).unwrap();
        }
    }
}
