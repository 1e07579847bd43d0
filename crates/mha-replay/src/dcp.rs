//! Decode context parallelism over NCCL in the replay (`--dcp N
//! --dcp-gpus spread`, issue 17): one thread and GPU a rank, each running
//! the whole replay with its backends' decode passes over the group
//! ([`mha_backend::MhaBackend::attach_decode_comm`]), and the join of the
//! ranks' reports.

use std::sync::Arc;

use indicatif::ProgressBar;
use paged_attention::nccl::{DcpComm, DcpId};

use crate::config::Setup;
use crate::error::{ReplayError, Result};
use crate::replay::run_ranks_with;
use crate::report::{gbps, RankReport, Report};

/// Replays `setup` with decode context parallelism over NCCL
/// (`--dcp N --dcp-gpus spread`): rank `r` on `cuda:(base + r)`, each rank
/// a thread that builds its own engine and backends on its GPU, joins the
/// group (one NCCL unique id made here) and runs the whole replay — the
/// same passes in the same order on every rank, its decode passes reading
/// its interleaved pages, all-gathering the partial states and merging
/// them, its own checker comparing its merged outputs with the f64
/// reference. `progress` follows rank 0.
///
/// The report is rank 0's, with one [`RankReport`] a rank (device, times,
/// bytes its decode passes read, its check and its sampled rows' hash);
/// the whole run's wall time is the slowest rank's. A rank whose hash is
/// not rank 0's is a mismatch (`check.first_mismatch` names it). Check
/// figures and device-error events are summed over the ranks, so an event
/// every rank counts (a K/V write: each rank writes every row) counts once
/// a rank: nothing a rank saw is hidden.
///
/// # Errors
/// As [`run_ranks`]; [`ReplayError::Backend`] when NCCL is missing or
/// refuses, a device is missing, or a rank fails (the first rank's error;
/// a rank that fails mid-run leaves the others in their all-gather, so
/// the process must then be stopped).
pub fn run_dcp_ranks(setup: &Setup, progress: &ProgressBar) -> Result<Report> {
    let crate::config::ExecutorChoice::Cuda(base) = setup.executor else {
        return Err(ReplayError::Internal(
            "--dcp-gpus spread on the CPU executor".into(),
        ));
    };
    let n = setup.dcp;
    let id = DcpId::new().map_err(kernel_error)?;
    let hidden = ProgressBar::hidden();
    let results: Vec<Result<Report>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let bar = if r == 0 { progress } else { &hidden };
                sc.spawn(move || -> Result<Report> {
                    let mut rank_setup = setup.clone();
                    rank_setup.executor = crate::config::ExecutorChoice::Cuda(base + r);
                    let gpu = kernel_rt::Gpu::shared_on(base + r).map_err(kernel_error)?;
                    let comm = Arc::new(DcpComm::new(&gpu, r, n, id).map_err(kernel_error)?);
                    let mut engine = crate::engine_for(&rank_setup)?;
                    run_ranks_with(&rank_setup, &mut [engine.as_mut()], bar, Some(comm))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ReplayError::Internal("a --dcp rank thread panicked".into()))
                })
            })
            .collect()
    });
    let reports = results.into_iter().collect::<Result<Vec<Report>>>()?;
    Ok(join_dcp_reports(reports))
}

fn kernel_error(e: kernel_rt::KernelError) -> ReplayError {
    ReplayError::Backend(mha_backend::BackendError::Kernel(e))
}

/// Rank 0's report with every rank's figures ([`run_dcp_ranks`]).
fn join_dcp_reports(reports: Vec<Report>) -> Report {
    let mut ranks = Vec::with_capacity(reports.len());
    for (r, rep) in reports.iter().enumerate() {
        let t = &rep.totals;
        ranks.push(RankReport {
            rank: r,
            q_heads: rep
                .config
                .heads
                .split('/')
                .next()
                .map_or(String::new(), |h| format!("0..{h}")),
            kv_heads: rep
                .config
                .heads
                .split('/')
                .nth(1)
                .map_or(String::new(), |h| format!("0..{h}")),
            device: rep.config.executor.clone(),
            attention_s: t.attention_s,
            metadata_s: t.metadata_s,
            kv_bytes_read: t.kv_bytes_read,
            bandwidth_gbps: gbps(t.kv_bytes_read, t.attention_s),
            flops: rep.modes.iter().map(|m| m.flops).sum(),
            device_errors: rep.device_errors.count,
            output_hash: rep.check.output_hash.clone(),
            mismatched_pairs: rep.check.mismatched_pairs,
        });
    }
    let mut iter = reports.into_iter();
    let mut main = iter.next().unwrap_or_default();
    for (r, rep) in iter.enumerate() {
        let r = r + 1;
        main.totals.wall_s = main.totals.wall_s.max(rep.totals.wall_s);
        main.check.mismatched_pairs += rep.check.mismatched_pairs;
        main.check.mismatched_elements += rep.check.mismatched_elements;
        main.check.max_abs_err = main.check.max_abs_err.max(rep.check.max_abs_err);
        main.check.max_tolerance_ratio = main
            .check
            .max_tolerance_ratio
            .max(rep.check.max_tolerance_ratio);
        if main.check.first_mismatch.is_none() {
            main.check.first_mismatch = rep.check.first_mismatch.map(|m| format!("rank {r}: {m}"));
        }
        if rep.check.output_hash != main.check.output_hash {
            main.check.mismatched_pairs += 1;
            main.check.first_mismatch.get_or_insert_with(|| {
                format!(
                    "rank {r}: sampled rows hash {} differs from rank 0's {}",
                    rep.check.output_hash, main.check.output_hash
                )
            });
        }
        main.device_errors.count += rep.device_errors.count;
        for f in rep.device_errors.families {
            match main
                .device_errors
                .families
                .iter_mut()
                .find(|m| m.family == f.family)
            {
                Some(m) => {
                    m.count += f.count;
                    m.flags |= f.flags;
                    for e in f.events {
                        if !m.events.contains(&e) {
                            m.events.push(e);
                        }
                    }
                }
                None => main.device_errors.families.push(f),
            }
        }
    }
    main.ranks = ranks;
    main
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::FamilyErrors;

    /// A rank's report: `hash` of its sampled rows, `wall` seconds, one
    /// fp8-kv device error event when `err`.
    fn rank_report(device: &str, hash: &str, wall: f64, err: bool) -> Report {
        let mut r = Report::default();
        r.config.executor = device.into();
        r.config.heads = "32/8/128".into();
        r.totals.wall_s = wall;
        r.totals.attention_s = 2.0;
        r.totals.kv_bytes_read = 4e9;
        r.check.pairs = 10;
        r.check.output_hash = hash.into();
        if err {
            r.device_errors.count = 1;
            r.device_errors.families.push(FamilyErrors {
                family: "fp8-kv".into(),
                count: 1,
                flags: 2,
                events: vec!["bad slot".into()],
            });
        }
        r
    }

    #[test]
    fn dcp_reports_join_with_a_row_a_rank() {
        let r = join_dcp_reports(vec![
            rank_report("cuda:0", "ab", 3.0, false),
            rank_report("cuda:1", "ab", 5.0, true),
        ]);
        assert_eq!(r.ranks.len(), 2);
        assert_eq!(r.ranks[1].device, "cuda:1");
        assert_eq!(
            (r.ranks[0].q_heads.as_str(), r.ranks[0].kv_heads.as_str()),
            ("0..32", "0..8")
        );
        assert_eq!(r.ranks[1].bandwidth_gbps, 2.0);
        assert_eq!(r.totals.wall_s, 5.0, "the slowest rank's wall time");
        assert_eq!(r.check.mismatched_pairs, 0);
        assert_eq!(r.device_errors.count, 1);
        assert_eq!(r.device_errors.families[0].family, "fp8-kv");
    }

    #[test]
    fn a_rank_with_other_outputs_is_a_mismatch() {
        let r = join_dcp_reports(vec![
            rank_report("cuda:0", "ab", 1.0, true),
            rank_report("cuda:1", "cd", 1.0, true),
        ]);
        assert_eq!(r.check.mismatched_pairs, 1);
        let m = r.check.first_mismatch.unwrap();
        assert!(m.contains("rank 1") && m.contains("cd"), "{m}");
        assert_eq!(r.ranks[1].output_hash, "cd");
        // One family, its events counted once a rank.
        assert_eq!(r.device_errors.count, 2);
        assert_eq!(r.device_errors.families.len(), 1);
        assert_eq!(r.device_errors.families[0].count, 2);
        assert_eq!(r.device_errors.families[0].events.len(), 1);
    }
}
