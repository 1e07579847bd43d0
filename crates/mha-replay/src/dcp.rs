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
/// a rank that fails (an error or a panic) during the run aborts every
/// rank's membership ([`DcpComm::abort`]), which releases the others from
/// their all-gathers: they fail too, and the error returned is the failed
/// rank's own. A rank that finished while the group was aborted fails as
/// well (its last all-gathers' results are unspecified).
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
                    let guard = AbortOnPanic { gate, rank: r };
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
                            let _ = gate.pass(r, Some(e.to_string()));
                            std::mem::forget(guard);
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
                    // The rank's backends (which own the CUDA graphs that
                    // captured its all-gathers) live inside run_ranks_with:
                    // dropped when it returns or unwinds, before this rank
                    // aborts the group (NCCL's last abort waits for every
                    // such graph to be destroyed: `DcpComm::abort`).
                    let out = run_ranks_with(&rank_setup, &mut [engine.as_mut()], bar, Some(&join));
                    std::mem::forget(guard);
                    gate.finish(r, out)
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
    Ok(join_dcp_reports(gate.first_cause(results)?))
}

/// A barrier the ranks pass together, twice (before joining the NCCL group
/// and before the first pass), carrying whether any rank failed: NCCL's
/// calls wait for every rank, so a rank that failed alone must release the
/// others first. Once joined, the ranks' memberships are registered here,
/// so that a rank failing during the run aborts them all.
pub(crate) struct Gate {
    barrier: Barrier,
    /// The first failure carried to gate `g` (0: before joining, 1:
    /// before the run), kept apart so that a rank already failing at the
    /// next gate cannot be read at this one by a rank slow to leave it.
    failed: Mutex<[Option<String>; 2]>,
    /// Rank `r`'s membership once it joined.
    members: Mutex<Vec<Option<Arc<dyn Abort>>>>,
    /// The first rank whose failure during the run aborted the group.
    cause: Mutex<Option<usize>>,
    /// Gates rank `r` has passed (0, 1 or 2).
    passed: Vec<std::sync::atomic::AtomicUsize>,
}

/// What the gate needs of a rank's membership ([`DcpComm`]).
pub(crate) trait Abort: Send + Sync {
    /// Ends the membership's collectives; see [`DcpComm::abort`].
    fn abort(&self, why: &str) -> kernel_rt::Result<()>;
    /// Why it was aborted, if it was.
    fn aborted(&self) -> Option<String>;
}

impl Abort for DcpComm {
    fn abort(&self, why: &str) -> kernel_rt::Result<()> {
        DcpComm::abort(self, why)
    }

    fn aborted(&self) -> Option<String> {
        DcpComm::aborted(self)
    }
}

/// Releases the other ranks when its rank's thread unwinds from a panic
/// (a drop without a panic does nothing; the normal paths forget it): before the
/// run, by passing the next gate with a failure (every rank returns after
/// a gate that carries one); during the run, by aborting the group.
struct AbortOnPanic<'a> {
    gate: &'a Gate,
    rank: usize,
}

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        const WHY: &str = "the rank's thread panicked";
        if !std::thread::panicking() {
            return;
        }
        if self.gate.passes(self.rank) < 2 {
            let _ = self.gate.pass(self.rank, Some(WHY.into()));
        } else {
            self.gate.abort_all(self.rank, WHY);
        }
    }
}

impl Gate {
    fn new(ranks: usize) -> Self {
        Self {
            barrier: Barrier::new(ranks),
            failed: Mutex::new([None, None]),
            members: Mutex::new((0..ranks).map(|_| None).collect()),
            cause: Mutex::new(None),
            passed: (0..ranks).map(|_| Default::default()).collect(),
        }
    }

    /// Gates rank `rank` has passed.
    fn passes(&self, rank: usize) -> usize {
        self.passed
            .get(rank)
            .map_or(0, |p| p.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Registers rank `rank`'s membership (once it joined).
    fn register(&self, rank: usize, member: Arc<dyn Abort>) {
        if let Some(m) = self
            .members
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(rank)
        {
            *m = Some(member);
        }
    }

    /// Rank `rank` failed during the run (`why`): aborts every registered
    /// membership (the first failing rank is the group's cause). An abort
    /// that fails is reported on stderr: nothing else can be done for it.
    fn abort_all(&self, rank: usize, why: &str) {
        self.cause
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(rank);
        // Cloned out: an abort may wait for a rank inside an NCCL call.
        let members: Vec<(usize, Arc<dyn Abort>)> = self
            .members
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .enumerate()
            .filter_map(|(r, m)| m.clone().map(|m| (r, m)))
            .collect();
        let why = format!("--dcp rank {rank} failed: {why}");
        for (r, m) in members {
            if let Err(e) = m.abort(&why) {
                eprintln!("mha-replay: aborting --dcp rank {r}'s NCCL membership: {e}");
            }
        }
    }

    /// Rank `rank`'s result once its run returned: a failure aborts the
    /// group; a success of a rank whose membership was aborted meanwhile
    /// becomes an error.
    fn finish(&self, rank: usize, out: Result<Report>) -> Result<Report> {
        match out {
            Err(e) => {
                self.abort_all(rank, &e.to_string());
                Err(e)
            }
            Ok(report) => {
                let member = self
                    .members
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(rank)
                    .cloned()
                    .flatten();
                match member.and_then(|m| m.aborted()) {
                    Some(why) => Err(ReplayError::Internal(format!(
                        "--dcp rank {rank} finished, but its group was aborted: {why}"
                    ))),
                    None => Ok(report),
                }
            }
        }
    }

    /// Every rank's report, or the error of the rank that caused the
    /// group's abort (the first failing rank otherwise).
    fn first_cause(&self, results: Vec<Result<Report>>) -> Result<Vec<Report>> {
        let cause = *self.cause.lock().unwrap_or_else(PoisonError::into_inner);
        let mut results = results;
        if let Some(c) = cause.filter(|&c| matches!(results.get(c), Some(Err(_)))) {
            // An `Err` (checked above): returned here.
            results.swap_remove(c)?;
        }
        results.into_iter().collect()
    }

    /// Waits for every rank; `Err` with the first failure when any rank
    /// (this one with `failed`) failed before this pass.
    fn pass(&self, rank: usize, failed: Option<String>) -> Result<()> {
        // A rank's k-th pass is gate k.
        let g = self.passed.get(rank).map_or(0, |p| {
            p.fetch_add(1, std::sync::atomic::Ordering::SeqCst).min(1)
        });
        if let Some(f) = failed {
            let mut all = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
            all[g].get_or_insert(f);
        }
        self.barrier.wait();
        match &self.failed.lock().unwrap_or_else(PoisonError::into_inner)[g] {
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
        self.gate.pass(self.rank, failed)?;
        match DcpComm::new(&self.gpu, self.rank, self.ranks, self.id) {
            Ok(c) => {
                let c = Arc::new(c);
                self.gate.register(self.rank, c.clone());
                Ok(c)
            }
            Err(e) => {
                // The others, joined, wait at the second pass: release them.
                let e = kernel_error(e);
                let _ = self.gate.pass(self.rank, Some(e.to_string()));
                Err(e)
            }
        }
    }

    /// Passes the gate with this rank's attach result.
    ///
    /// # Errors
    /// Any rank's attach failure.
    pub(crate) fn confirm(&self, failed: Option<String>) -> Result<()> {
        self.gate.pass(self.rank, failed)
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

    /// Runs `rank(r)` for three ranks, one scoped thread each; a rank
    /// whose thread panicked gives `Err("panicked")`.
    fn three_ranks<T: Send>(rank: impl Fn(usize) -> Result<T> + Sync) -> Vec<Result<T>> {
        kernel_rt::testing::per_rank_or(3, || ReplayError::Internal("panicked".into()), rank)
    }

    #[test]
    fn a_rank_that_fails_releases_the_others_at_the_gate() {
        for fail in [None, Some(1)] {
            let gate = Gate::new(3);
            let results =
                three_ranks(|r| gate.pass(r, (fail == Some(r)).then(|| format!("rank {r}"))));
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

    /// A membership whose "collective" blocks until it is aborted.
    #[derive(Default)]
    struct Member {
        why: Mutex<Option<String>>,
        cv: std::sync::Condvar,
    }

    impl Abort for Member {
        fn abort(&self, why: &str) -> kernel_rt::Result<()> {
            self.why
                .lock()
                .unwrap()
                .get_or_insert_with(|| why.to_string());
            self.cv.notify_all();
            Ok(())
        }

        fn aborted(&self) -> Option<String> {
            self.why.lock().unwrap().clone()
        }
    }

    impl Member {
        /// Blocks like an all-gather whose peer never comes, until aborted
        /// (a test that would hang fails after 20 s instead).
        fn collective(&self) -> Result<()> {
            let g = self.why.lock().unwrap();
            let (g, t) = self
                .cv
                .wait_timeout_while(g, std::time::Duration::from_secs(20), |w| w.is_none())
                .unwrap();
            assert!(!t.timed_out(), "the abort never came");
            Err(ReplayError::Internal(format!(
                "communicator aborted: {}",
                g.clone().unwrap_or_default()
            )))
        }
    }

    /// Runs three ranks over `Member`s: rank `fail` fails (`Err`, or a
    /// panic when `panics`), the others block in a collective (from which
    /// rank 2 goes on to finish its run when `two_finishes`).
    fn group_run(fail: usize, panics: bool, two_finishes: bool) -> (Gate, Vec<Result<Report>>) {
        let gate = Gate::new(3);
        let members: Vec<Arc<Member>> = (0..3).map(|_| Arc::new(Member::default())).collect();
        for (r, m) in members.iter().enumerate() {
            gate.register(r, m.clone());
        }
        let results = three_ranks(|r| {
            let m = &members[r];
            // Past both gates (joined and attached): the run.
            gate.pass(r, None)?;
            gate.pass(r, None)?;
            let guard = AbortOnPanic {
                gate: &gate,
                rank: r,
            };
            let out = if r == fail {
                assert!(!panics, "rank {r} panics");
                Err(ReplayError::Internal(format!("rank {r} ran out of memory")))
            } else if r == 2 && two_finishes {
                // Its last collective returned after the abort (its result
                // unspecified), and the run ended.
                let _ = m.collective();
                Ok(Report::default())
            } else {
                m.collective().map(|()| Report::default())
            };
            std::mem::forget(guard);
            gate.finish(r, out)
        });
        (gate, results)
    }

    #[test]
    fn a_rank_that_panics_before_the_run_releases_the_others_at_the_gate() {
        for panic_after in [0usize, 1] {
            let gate = Gate::new(3);
            let results = three_ranks(|r| {
                let guard = AbortOnPanic {
                    gate: &gate,
                    rank: r,
                };
                for pass in 0..2 {
                    assert!(
                        !(r == 1 && pass == panic_after),
                        "rank 1 panics after {pass} gate(s)"
                    );
                    gate.pass(r, None)?;
                }
                std::mem::forget(guard);
                Ok(())
            });
            for (r, out) in results.iter().enumerate() {
                let e = out.as_ref().unwrap_err().to_string();
                assert!(
                    e.contains("panicked"),
                    "rank {r} after gate {panic_after}: {e}"
                );
            }
        }
    }

    #[test]
    fn a_rank_that_fails_mid_run_releases_the_others_from_their_collectives() {
        let (gate, results) = group_run(1, false, false);
        for (r, out) in results.iter().enumerate() {
            let e = out.as_ref().unwrap_err().to_string();
            assert!(e.contains("ran out of memory"), "rank {r}: {e}");
            if r != 1 {
                assert!(
                    e.contains("aborted") && e.contains("rank 1 failed"),
                    "rank {r}: {e}"
                );
            }
        }
        let e = gate.first_cause(results).unwrap_err().to_string();
        assert_eq!(
            e, "internal replay error: rank 1 ran out of memory",
            "the failed rank's own error"
        );
    }

    #[test]
    fn a_panicking_rank_aborts_the_group() {
        let (gate, results) = group_run(0, true, false);
        assert!(results.iter().all(Result::is_err));
        let e = gate.first_cause(results).unwrap_err().to_string();
        assert!(e.contains("panicked"), "{e}");
    }

    #[test]
    fn a_rank_that_finished_in_an_aborted_group_fails() {
        let (gate, results) = group_run(1, false, true);
        let e = results[2].as_ref().unwrap_err().to_string();
        assert!(e.contains("finished, but its group was aborted"), "{e}");
        assert!(gate.first_cause(results).is_err());
        // Without a failure every rank's report comes back.
        let gate = Gate::new(2);
        let ok = vec![
            gate.finish(0, Ok(Report::default())),
            gate.finish(1, Ok(Report::default())),
        ];
        assert_eq!(gate.first_cause(ok).unwrap().len(), 2);
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
