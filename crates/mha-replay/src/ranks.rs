//! Tensor-parallel ranks of a replay (`--tp`): each rank's target and draft
//! backends, the pool operations mirrored over all of them, and the join of
//! the ranks' pass outputs into the unsharded rows the checker reads.

use mha_backend::{HeadShard, MhaBackend, MultiStepDraftBackend};

use crate::engine::PassOutput;
use crate::error::{ReplayError, Result};
use crate::pass::Pass;
use crate::sched::KvPools;

/// The draft model's backend.
#[derive(Debug)]
pub(crate) enum Draft {
    /// `S = 1`: no draft decode step, one backend.
    Single(Box<MhaBackend>),
    /// `S ≥ 2`: the multi-step draft backend (its step 0 also runs the
    /// draft's extend passes: they share one state).
    Multi(MultiStepDraftBackend),
}

impl Draft {
    pub(crate) fn main(&mut self) -> Result<&mut MhaBackend> {
        self.step(0)
    }

    pub(crate) fn step(&mut self, s: usize) -> Result<&mut MhaBackend> {
        match self {
            Self::Single(b) if s == 0 => Ok(b),
            Self::Single(_) => Err(ReplayError::Internal(format!(
                "draft decode step {s} without a multi-step draft backend"
            ))),
            Self::Multi(m) => m.step_mut(s).ok_or_else(|| {
                ReplayError::Internal(format!("multi-step draft backend without step {s}"))
            }),
        }
    }
}

/// Which backend of a rank a pass runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Which {
    Target,
    /// The draft's main backend (extend passes, and step 0).
    Draft,
    /// Draft decode step `s` of the multi-step draft backend.
    DraftStep(usize),
}

/// One tensor-parallel rank: the target backend and, with speculation,
/// the draft backend, on the rank's heads.
#[derive(Debug)]
pub(crate) struct Rank {
    pub(crate) target: MhaBackend,
    pub(crate) draft: Option<Draft>,
}

impl Rank {
    pub(crate) fn pick(&mut self, which: Which) -> Result<&mut MhaBackend> {
        match (which, &mut self.draft) {
            (Which::Target, _) => Ok(&mut self.target),
            (Which::Draft, Some(d)) => d.main(),
            (Which::DraftStep(s), Some(d)) => d.step(s),
            (_, None) => Err(ReplayError::Internal(
                "a draft pass without a draft model".into(),
            )),
        }
    }

    /// The device errors of the rank's target and draft backends, merged.
    fn device_errors(&mut self) -> Result<mha_backend::DeviceErrorReport> {
        let mut e = self.target.device_errors();
        if let Some(d) = &mut self.draft {
            e.merge(&d.main()?.device_errors());
        }
        Ok(e)
    }

    /// The target and the draft's main backend (the ones holding pools).
    fn pool_backends(&mut self) -> Result<Vec<&mut MhaBackend>> {
        let mut v = vec![&mut self.target];
        if let Some(d) = &mut self.draft {
            v.push(d.main()?);
        }
        Ok(v)
    }
}

/// Every rank's backends; pool operations are mirrored so all hold the
/// same rows and slots (target and draft, every rank).
#[derive(Debug)]
pub(crate) struct Models {
    pub(crate) ranks: Vec<Rank>,
}

impl Models {
    /// Applies `f` to every pool-holding backend; all must return the same.
    fn mirror<T: PartialEq + std::fmt::Debug>(
        &mut self,
        what: &str,
        mut f: impl FnMut(&mut MhaBackend) -> mha_backend::Result<T>,
    ) -> Result<T> {
        let mut first: Option<T> = None;
        for rank in &mut self.ranks {
            for b in rank.pool_backends()? {
                let got = f(b)?;
                match &first {
                    None => first = Some(got),
                    Some(want) if *want == got => {}
                    Some(want) => {
                        return Err(ReplayError::Internal(format!(
                        "the ranks' target and draft pools diverged on {what}: {want:?} vs {got:?}"
                    )))
                    }
                }
            }
        }
        first.ok_or_else(|| ReplayError::Internal("no rank".into()))
    }

    pub(crate) fn has_draft(&self) -> bool {
        self.ranks.first().is_some_and(|r| r.draft.is_some())
    }

    /// Each rank's device errors (one read of its backends' error words).
    pub(crate) fn rank_device_errors(&mut self) -> Result<Vec<mha_backend::DeviceErrorReport>> {
        self.ranks.iter_mut().map(Rank::device_errors).collect()
    }
}

impl KvPools for Models {
    fn alloc_request(&mut self) -> Result<usize> {
        self.mirror("alloc_request", |b| b.alloc_request())
    }

    fn alloc_tokens(&mut self, grow: &[(usize, usize)]) -> Result<Vec<i64>> {
        self.mirror("alloc_tokens", |b| b.alloc_tokens(grow))
    }

    fn truncate(&mut self, row: usize, len: usize) -> Result<()> {
        self.mirror("truncate", |b| b.truncate_request(row, len))
    }

    fn free_request(&mut self, row: usize) -> Result<()> {
        self.mirror("free_request", |b| b.free_request(row))
    }

    fn free_pages(&self) -> usize {
        self.ranks
            .first()
            .map_or(0, |r| r.target.with_pools(|p| p.free_pages()))
    }
}

/// Per-rank totals (`--tp`).
#[derive(Debug, Clone, Default)]
pub(crate) struct RankTotals {
    pub(crate) attention_s: f64,
    pub(crate) metadata_s: f64,
    pub(crate) kv_bytes: f64,
    pub(crate) flops: f64,
}

/// One pass's output from its ranks' outputs (rank order): device times
/// add up when the ranks ran one after another on one GPU, and are the
/// slowest rank's when they ran `concurrent`ly on their own GPUs (host
/// metadata time and the split-timing parts add up either way: the parts
/// are then summed over the GPUs); the graph flag holds when every rank
/// replayed a graph, and each sampled `(layer, part)` gets its rows joined
/// head-wise — row `j` is rank 0's heads of row `j`, then rank 1's, … —
/// which is the unsharded row, since rank `r` holds the `r`-th block of
/// query heads.
///
/// # Errors
/// [`ReplayError::Internal`] when the ranks sampled different pairs or
/// returned rows of the wrong length.
pub(crate) fn join_ranks(
    mut outs: Vec<PassOutput>,
    pass: &Pass,
    shards: &[[Vec<HeadShard>; 2]],
    concurrent: bool,
) -> Result<PassOutput> {
    if outs.len() == 1 {
        return outs
            .pop()
            .ok_or_else(|| ReplayError::Internal("no rank".into()));
    }
    let mut it = outs.into_iter();
    let mut joined = it
        .next()
        .ok_or_else(|| ReplayError::Internal("no rank".into()))?;
    let rest: Vec<PassOutput> = it.collect();
    for o in &rest {
        joined.metadata_s += o.metadata_s;
        if concurrent {
            // Ranks on their own GPUs: the pass takes its slowest rank's time.
            joined.attention_s = joined.attention_s.max(o.attention_s);
            joined.generate_s = joined.generate_s.max(o.generate_s);
        } else {
            joined.attention_s += o.attention_s;
            joined.generate_s += o.generate_s;
        }
        joined.graph &= o.graph;
        joined.parts = match (joined.parts, &o.parts) {
            (Some(mut a), Some(b)) => {
                a.add(b);
                Some(a)
            }
            _ => None,
        };
    }
    let m = pass.model as usize;
    for (i, s) in joined.sampled.iter_mut().enumerate() {
        let n = pass
            .parts
            .get(s.part)
            .ok_or_else(|| ReplayError::Internal(format!("sampled part {} of a pass", s.part)))?
            .n;
        let widths: Vec<usize> = shards
            .iter()
            .map(|r| r[m][s.layer].layer.q_row_elems())
            .collect();
        let mut ranks: Vec<&[u16]> = vec![&s.rows];
        for o in &rest {
            let t = o
                .sampled
                .get(i)
                .filter(|t| t.layer == s.layer && t.part == s.part);
            let t = t.ok_or_else(|| {
                ReplayError::Internal("the ranks sampled different (layer, part) pairs".into())
            })?;
            ranks.push(&t.rows);
        }
        if ranks
            .iter()
            .zip(&widths)
            .any(|(rows, w)| rows.len() != n * w)
        {
            return Err(ReplayError::Internal(
                "a rank returned sampled rows of the wrong length".into(),
            ));
        }
        let mut rows = Vec::with_capacity(n * widths.iter().sum::<usize>());
        for j in 0..n {
            for (r, w) in ranks.iter().zip(&widths) {
                rows.extend_from_slice(&r[j * w..(j + 1) * w]);
            }
        }
        s.rows = rows;
    }
    Ok(joined)
}
