//! Decode context parallelism over NCCL in the replay (`--dcp N
//! --dcp-gpus spread`, issue 17): one thread and GPU a rank, each running
//! the whole replay with its backends' decode passes over the group
//! ([`mha_backend::MhaBackend::attach_decode_comm`]), and the join of the
//! ranks' reports.

use std::sync::{Arc, Barrier, Mutex, PoisonError};

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
/// not rank 0's counts as one mismatched pair (`check.first_mismatch` names
/// it). Check figures (pairs, rows, elements, mismatches) and device-error
/// events are summed over the ranks, so an event every rank counts (a K/V
/// write: each rank writes every row) counts once a rank: nothing a rank
/// saw is hidden.
///
/// # Errors
/// As [`run_ranks`]; [`ReplayError::Backend`] when NCCL is missing or
/// refuses, a device is missing, or a rank fails (the first rank's error).
/// A rank that fails while building its engine or backends, or attaching
/// them, releases the others at a gate before any NCCL call waits for it;
/// a rank that fails during the run leaves the others in their all-gather
/// (no NCCL timeout is set), so the process must then be stopped.
pub fn run_dcp_ranks(setup: &Setup, progress: &ProgressBar) -> Result<Report> {
    let crate::config::ExecutorChoice::Cuda(base) = setup.executor else {
        return Err(ReplayError::Internal(
            "--dcp-gpus spread on the CPU executor".into(),
        ));
    };
    let n = setup.dcp;
    let id = DcpId::new().map_err(kernel_error)?;
    let hidden = ProgressBar::hidden();
    let gate = Gate::new(n);
    let results: Vec<Result<Report>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let bar = if r == 0 { progress } else { &hidden };
                let gate = &gate;
                sc.spawn(move || -> Result<Report> {
                    let mut rank_setup = setup.clone();
                    rank_setup.executor = crate::config::ExecutorChoice::Cuda(base + r);
                    let engine = kernel_rt::Gpu::shared_on(base + r)
                        .map_err(kernel_error)
                        .and_then(|gpu| Ok((gpu, crate::engine_for(&rank_setup)?)));
                    let (gpu, mut engine) = match engine {
                        Ok(x) => x,
                        Err(e) => {
                            // Its failure releases the others at the
                            // gate (which hands it back: `e` says more).
                            let _ = gate.pass(Some(e.to_string()));
                            return Err(e);
                        }
                    };
                    let join = RankJoin {
                        gate,
                        gpu,
                        rank: r,
                        ranks: n,
                        id,
                    };
                    run_ranks_with(&rank_setup, &mut [engine.as_mut()], bar, Some(&join))
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

/// A barrier the ranks pass together, twice (before joining the NCCL group
/// and before the first pass), carrying whether any rank failed: NCCL's
/// calls wait for every rank, so a rank that failed alone must release the
/// others first.
pub(crate) struct Gate {
    barrier: Barrier,
    failed: Mutex<Option<String>>,
}

impl Gate {
    fn new(ranks: usize) -> Self {
        Self {
            barrier: Barrier::new(ranks),
            failed: Mutex::new(None),
        }
    }

    /// Waits for every rank; `Err` with the first failure when any rank
    /// (this one with `failed`) failed before this pass.
    fn pass(&self, failed: Option<String>) -> Result<()> {
        if let Some(f) = failed {
            let mut g = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
            g.get_or_insert(f);
        }
        self.barrier.wait();
        match &*self.failed.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(f) => Err(ReplayError::Internal(format!(
                "a --dcp rank failed before the run: {f}"
            ))),
            None => Ok(()),
        }
    }
}

/// What [`run_ranks_with`] needs to join one rank to the group once its
/// backends are built.
pub(crate) struct RankJoin<'a> {
    gate: &'a Gate,
    gpu: Arc<kernel_rt::Gpu>,
    rank: usize,
    ranks: usize,
    id: DcpId,
}

impl RankJoin<'_> {
    /// Passes the gate with this rank's setup result (`failed`), then joins
    /// the communicator on the rank's GPU.
    ///
    /// # Errors
    /// Any rank's setup failure; NCCL's errors.
    pub(crate) fn join(&self, failed: Option<String>) -> Result<Arc<DcpComm>> {
        self.gate.pass(failed)?;
        match DcpComm::new(&self.gpu, self.rank, self.ranks, self.id) {
            Ok(c) => Ok(Arc::new(c)),
            Err(e) => {
                // The others, joined, wait at the second pass: release them.
                let e = kernel_error(e);
                let _ = self.gate.pass(Some(e.to_string()));
                Err(e)
            }
        }
    }

    /// Passes the gate with this rank's attach result.
    ///
    /// # Errors
    /// Any rank's attach failure.
    pub(crate) fn confirm(&self, failed: Option<String>) -> Result<()> {
        self.gate.pass(failed)
    }
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
        main.check.pairs += rep.check.pairs;
        main.check.rows += rep.check.rows;
        main.check.elements += rep.check.elements;
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
    fn a_rank_that_fails_releases_the_others_at_the_gate() {
        for fail in [None, Some(1)] {
            let gate = Gate::new(3);
            let results: Vec<Result<()>> = std::thread::scope(|sc| {
                let hs: Vec<_> = (0..3)
                    .map(|r| {
                        let gate = &gate;
                        sc.spawn(move || gate.pass((fail == Some(r)).then(|| format!("rank {r}"))))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            match fail {
                None => assert!(results.iter().all(Result::is_ok)),
                Some(_) => assert!(results.iter().all(|r| r
                    .as_ref()
                    .unwrap_err()
                    .to_string()
                    .contains("rank 1"))),
            }
        }
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
