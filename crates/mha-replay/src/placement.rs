//! Where the ranks of a replay run (`--tp-gpus`, `--dcp-gpus`): one after
//! another (or simulated) on one executor, or one GPU a rank.

use clap::ValueEnum;

use crate::config::ExecutorChoice;
use crate::error::{flag_err, Result};

/// `--tp-gpus` / `--dcp-gpus`: where the tensor-parallel or decode
/// context-parallel ranks of the CUDA executor run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RankGpus {
    /// `spread` where it can run (see the flag), else `one`.
    Auto,
    /// Every rank on the `--device` GPU, one after another (simulated).
    One,
    /// Rank `r` on `cuda:(N + r)` (`N` the `--device` ordinal): its own
    /// context, stream, engine and backends; the GPUs run concurrently.
    Spread,
}

/// The `--tp-gpus` choice (the same values as `--dcp-gpus`).
pub type TpGpus = RankGpus;

/// Resolves `--tp-gpus` for `tp` ranks on `executor`: whether rank `r`
/// runs on `cuda:(N + r)`. `spread` without a device per rank is refused
/// naming the flag; `auto` falls back to one GPU with a note.
pub(crate) fn resolve_tp_gpus(
    choice: TpGpus,
    executor: ExecutorChoice,
    tp: usize,
    notes: &mut Vec<String>,
) -> Result<bool> {
    let ExecutorChoice::Cuda(base) = executor else {
        if choice == TpGpus::Spread && tp > 1 {
            notes.push(format!(
                "--tp {tp}: the CPU executor runs the ranks one after another (--tp-gpus spread has no effect)"
            ));
        }
        return Ok(false);
    };
    if tp == 1 || choice == TpGpus::One {
        return Ok(false);
    }
    let devices = kernel_rt::gpu_status().devices();
    let enough = base + tp <= devices;
    match (choice, enough) {
        (_, true) => {
            notes.push(format!(
                "--tp {tp}: rank r on cuda:{base} + r (cuda:{base}..cuda:{})",
                base + tp - 1
            ));
            Ok(true)
        }
        (TpGpus::Spread, false) => Err(flag_err(
            "--tp-gpus",
            format!(
                "spread needs cuda:{base}..cuda:{} for --tp {tp}; the driver reports {devices} device(s)",
                base + tp - 1
            ),
        )),
        _ => {
            notes.push(format!(
                "--tp {tp}: {devices} device(s) from cuda:{base} on, so the ranks run one after another on cuda:{base}"
            ));
            Ok(false)
        }
    }
}

/// Resolves `--dcp-gpus` for `dcp` ranks on `executor` beside `tp`
/// tensor-parallel ranks: whether rank `r` runs on `cuda:(N + r)` over
/// NCCL. `spread` without a device per rank, without libnccl or with
/// `--tp` > 1 is refused naming the flag; `auto` falls back to simulated
/// ranks on one GPU with a note. `nccl` says whether libnccl loads.
pub(crate) fn resolve_dcp_gpus(
    choice: RankGpus,
    executor: ExecutorChoice,
    dcp: usize,
    tp: usize,
    nccl: bool,
    notes: &mut Vec<String>,
) -> Result<bool> {
    let ExecutorChoice::Cuda(base) = executor else {
        if choice == RankGpus::Spread {
            return Err(flag_err(
                "--dcp-gpus",
                "spread runs ranks on CUDA devices; the CPU executor simulates them",
            ));
        }
        return Ok(false);
    };
    if choice == RankGpus::One || (choice == RankGpus::Auto && dcp == 1) {
        return Ok(false);
    }
    let devices = kernel_rt::gpu_status().devices();
    let last = base + dcp - 1;
    let why_not = if tp > 1 {
        Some(format!(
            "--tp {tp} > 1 (tensor and context ranks do not combine here)"
        ))
    } else if !nccl {
        Some("libnccl not found (put the directory holding libnccl.so on LD_LIBRARY_PATH)".into())
    } else if base + dcp > devices {
        Some(format!(
            "cuda:{base}..cuda:{last} needed, the driver reports {devices} device(s)"
        ))
    } else {
        None
    };
    match (choice, why_not) {
        (_, None) => {
            notes.push(format!(
                "--dcp {dcp}: rank r on cuda:{base} + r (cuda:{base}..cuda:{last}), partial states all-gathered over NCCL"
            ));
            Ok(true)
        }
        (RankGpus::Spread, Some(w)) => Err(flag_err("--dcp-gpus", format!("spread: {w}"))),
        (_, Some(w)) => {
            notes.push(format!(
                "--dcp {dcp}: {w}, so the ranks are simulated on cuda:{base}"
            ));
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tp_gpus_resolves_by_executor_and_devices() {
        let mut notes = Vec::new();
        // The CPU executor and one rank never spread, whatever the flag.
        for choice in [TpGpus::Auto, TpGpus::One, TpGpus::Spread] {
            assert!(!resolve_tp_gpus(choice, ExecutorChoice::Cpu, 4, &mut notes).unwrap());
            assert!(!resolve_tp_gpus(choice, ExecutorChoice::Cuda(0), 1, &mut notes).unwrap());
        }
        // Only the CPU executor asked to spread says so.
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("no effect"), "{notes:?}");
        notes.clear();
        assert!(!resolve_tp_gpus(TpGpus::One, ExecutorChoice::Cuda(0), 2, &mut notes).unwrap());
        assert!(notes.is_empty());
        let devices = kernel_rt::gpu_status().devices();
        // More ranks than any machine here has devices: refused / one GPU.
        let tp = devices + 2;
        let e = resolve_tp_gpus(TpGpus::Spread, ExecutorChoice::Cuda(0), tp, &mut notes)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--tp-gpus"), "{e}");
        assert!(!resolve_tp_gpus(TpGpus::Auto, ExecutorChoice::Cuda(0), tp, &mut notes).unwrap());
        assert!(notes[0].contains("one after another"), "{notes:?}");
    }

    #[test]
    fn dcp_gpus_resolves_by_executor_devices_nccl_and_tp() {
        let mut notes = Vec::new();
        let cuda = ExecutorChoice::Cuda(0);
        // The CPU executor simulates; asking it to spread is refused.
        for choice in [RankGpus::Auto, RankGpus::One] {
            assert!(
                !resolve_dcp_gpus(choice, ExecutorChoice::Cpu, 4, 1, true, &mut notes).unwrap()
            );
        }
        let e = resolve_dcp_gpus(
            RankGpus::Spread,
            ExecutorChoice::Cpu,
            2,
            1,
            true,
            &mut notes,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--dcp-gpus"), "{e}");
        // `one`, and `auto` with one rank, never spread (and say nothing).
        assert!(!resolve_dcp_gpus(RankGpus::One, cuda, 2, 1, true, &mut notes).unwrap());
        assert!(!resolve_dcp_gpus(RankGpus::Auto, cuda, 1, 1, true, &mut notes).unwrap());
        assert!(notes.is_empty(), "{notes:?}");
        let devices = kernel_rt::gpu_status().devices();
        // More ranks than devices, no NCCL, or tensor-parallel ranks:
        // `spread` is refused naming the flag, `auto` simulates with a note.
        for (dcp, tp, nccl, why) in [
            (devices + 2, 1, true, "device(s)"),
            (1, 1, false, "libnccl"),
            (2, 2, true, "--tp"),
        ] {
            let e = resolve_dcp_gpus(RankGpus::Spread, cuda, dcp, tp, nccl, &mut notes)
                .unwrap_err()
                .to_string();
            assert!(e.contains("--dcp-gpus") && e.contains(why), "{e}");
            notes.clear();
            let auto = resolve_dcp_gpus(RankGpus::Auto, cuda, dcp.max(2), tp, nccl, &mut notes);
            assert!(!auto.unwrap());
            assert!(notes[0].contains("simulated"), "{notes:?}");
            notes.clear();
        }
        // Where this host has the devices and NCCL loads, `spread` spreads
        // (one rank: the one-rank group on cuda:0).
        if devices >= 1 {
            assert!(resolve_dcp_gpus(RankGpus::Spread, cuda, 1, 1, true, &mut notes).unwrap());
            assert!(notes[0].contains("NCCL"), "{notes:?}");
        }
    }
}
