//! The CUDA-graph path of [`MhaBackend`] (SEMANTICS.md §backend.4–5): graph
//! state, capture, bucket selection, replay, static inputs and outputs.

use crate::batch::ForwardBatch;
use crate::error::{batch_err, BackendError, Result};
use crate::executor::{graphs_of, graphs_of_mut, TensorRef};
use crate::graph::{GraphKey, GraphKind};
use crate::metadata;

use super::MhaBackend;

impl MhaBackend {
    /// Allocates the CUDA-graph state (SEMANTICS.md §backend.4.1) for buckets of up to
    /// `max_bs` rows and `max_num_tokens` tokens: one set of metadata
    /// buffers, static per-layer `q`/`k`/`v`/output buffers. Drops every
    /// captured graph.
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`] on the CPU executor (never a
    /// silent fallback to eager); driver errors.
    pub fn init_cuda_graph_state(&mut self, max_bs: usize, max_num_tokens: usize) -> Result<()> {
        graphs_of_mut(self.core().executor.as_mut())?.init_graph_state(max_bs, max_num_tokens)
    }

    /// Captures a whole step for a bucket (SEMANTICS.md §backend.4.2–4.3): the fused
    /// metadata launch, then every layer's K/V write (from the static
    /// inputs, [`MhaBackend::write_graph_inputs`]) and attention (into the
    /// static outputs). A [`GraphKind::DraftDecode`] step id is the
    /// caller's (normally [`MhaBackend::speculative_step_id`]); ragged verify
    /// uses `max_q_len = spec.num_draft_tokens`. Returns the bucket's key.
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`] (CPU executor, no graph state,
    /// impossible bucket); driver / validation errors.
    pub fn capture_cuda_graph(
        &mut self,
        kind: GraphKind,
        bs: usize,
        num_tokens: usize,
    ) -> Result<GraphKey> {
        let mut guard = self.core();
        let core = &mut *guard;
        let n = core.config.spec.map(|s| s.num_draft_tokens);
        let key = GraphKey::new(kind, bs, num_tokens, n)?;
        if num_tokens > core.config.context_len.saturating_mul(bs) {
            return Err(BackendError::GraphUnsupported(
                "bucket larger than the context allows".into(),
            ));
        }
        graphs_of_mut(core.executor.as_mut())?.capture_graph(key, &core.pools)?;
        Ok(key)
    }

    /// The captured buckets.
    pub fn cuda_graph_keys(&self) -> Vec<GraphKey> {
        self.core()
            .executor
            .graphs()
            .map_or_else(Vec::new, |g| g.graph_keys())
    }

    /// The bucket a replay of `batch` would use: the captured key of the
    /// batch's graph kind with the fewest rows (then tokens) that holds it
    /// (uniform modes: the same rows per request; ragged verify: padding
    /// rows within `max_q_len`, so capture ragged buckets with `bs =
    /// num_tokens` as upstream does, SEMANTICS.md §backend.5).
    ///
    /// # Errors
    /// [`BackendError::GraphUnsupported`] for extend-like modes or when no
    /// captured bucket fits; [`BackendError::Batch`] for an inconsistent batch.
    pub fn select_cuda_graph(&self, batch: &ForwardBatch) -> Result<GraphKey> {
        batch.check_lengths()?;
        let mode = metadata::resolve_mode(batch, self.step_id)?;
        let kind = GraphKind::of(mode).ok_or_else(|| {
            BackendError::GraphUnsupported(format!(
                "{:?} has no graph metadata (SEMANTICS.md §backend.9): run it eagerly",
                batch.forward_mode
            ))
        })?;
        let tokens = batch.out_cache_loc.len();
        let q_len = match mode {
            crate::AttnMode::TargetVerify { q_len } | crate::AttnMode::DraftExtendV2 { q_len } => {
                Some(q_len)
            }
            _ => None,
        };
        let mut keys: Vec<GraphKey> = self
            .cuda_graph_keys()
            .into_iter()
            .filter(|k| k.kind == kind && k.bs >= batch.batch_size && k.num_tokens >= tokens)
            .filter(|k| q_len.is_none_or(|q| q == k.q_len))
            .collect();
        keys.sort_by_key(|k| (k.bs, k.num_tokens));
        // Ragged verify: the padded lengths must stay within max_q_len
        // (SEMANTICS.md §backend.5 decision); buckets with bs = num_tokens always fit
        // when every real row has ≥ 1 token.
        keys.into_iter()
            .find(|k| kind != GraphKind::RaggedVerify || crate::batch::pad_for(batch, *k).is_ok())
            .ok_or_else(|| {
                BackendError::GraphUnsupported(format!(
                    "no captured {kind:?} bucket holds {} rows / {tokens} tokens",
                    batch.batch_size
                ))
            })
    }

    /// Copies layer `layer`'s inputs into the graph's static buffers
    /// (`q` `[n, Hq, D]`, `k`/`v` `[n, Hkv, D]`, model dtype, `n ≤
    /// max_num_tokens`; host or device tensors). Padding rows of a bucket
    /// read whatever the buffers hold past `n`.
    ///
    /// # Errors
    /// [`BackendError::UnknownLayer`]; [`BackendError::GraphUnsupported`];
    /// capacity / driver errors.
    pub fn write_graph_inputs(
        &mut self,
        layer: usize,
        q: TensorRef<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
    ) -> Result<()> {
        let mut guard = self.core();
        let core = &mut *guard;
        let plan = core.plans.get(layer).ok_or(BackendError::UnknownLayer {
            layer,
            num_layers: core.plans.len(),
        })?;
        graphs_of_mut(core.executor.as_mut())?.write_graph_inputs(plan, q, k, v)
    }

    /// Replays the captured step for `batch` (replay preparation, D3:
    /// padding rows get request row 0, `seq_len` 1, slot 0; ragged verify
    /// lengths padded and their metadata written eagerly, SEMANTICS.md §backend.5):
    /// uploads the padded inputs and the changed pool tables, launches the
    /// graph. No host synchronisation. Outputs land in the static output
    /// buffers ([`MhaBackend::read_graph_output`]). Returns the bucket used.
    ///
    /// # Errors
    /// As [`MhaBackend::select_cuda_graph`]; [`BackendError::Batch`] for
    /// request rows / lengths out of range; driver errors. Nothing is
    /// launched on error.
    pub fn replay_cuda_graph(&mut self, batch: &ForwardBatch) -> Result<GraphKey> {
        let key = self.select_cuda_graph(batch)?;
        let mut guard = self.core();
        let core = &mut *guard;
        let rows = core.pools.req_to_token_rows() as i64;
        let context = core.config.context_len as i64;
        let offset = match key.kind {
            GraphKind::DraftDecode { step } => i64::from(step) + 1,
            GraphKind::TargetVerify => key.q_len as i64,
            _ => 0,
        };
        for (i, (&r, &s)) in batch
            .req_pool_indices
            .iter()
            .zip(&batch.seq_lens)
            .enumerate()
        {
            if !(0..rows).contains(&r) {
                return Err(batch_err(
                    "req_pool_indices",
                    format!("row {i}: request row {r} outside [0, {rows})"),
                ));
            }
            let extra = batch
                .verify_lens()
                .and_then(|v| v.get(i))
                .map_or(offset, |&l| i64::from(l));
            if s < 0 || s + extra > context {
                return Err(batch_err(
                    "seq_lens",
                    format!(
                        "row {i}: attention length {} outside [0, {context}]",
                        s + extra
                    ),
                ));
            }
        }
        let padded = crate::batch::pad_for(batch, key)?;
        graphs_of_mut(core.executor.as_mut())?.replay_graph(key, &padded, &core.pools)?;
        Ok(key)
    }

    /// A host copy of the first `rows` rows (`[rows, Hq·D]`) of layer
    /// `layer`'s static graph output (synchronises).
    ///
    /// # Errors
    /// [`BackendError::UnknownLayer`]; [`BackendError::GraphUnsupported`];
    /// driver errors.
    pub fn read_graph_output(&self, layer: usize, rows: usize) -> Result<Vec<u16>> {
        let core = self.core();
        let plan = core.plans.get(layer).ok_or(BackendError::UnknownLayer {
            layer,
            num_layers: core.plans.len(),
        })?;
        graphs_of(core.executor.as_ref())?.read_graph_output(plan, rows)
    }

    /// Enqueues a device copy of output rows `[row0, row0 + rows)`
    /// (`[rows, Hq·D]`, model dtype bits) of layer `layer`'s static graph
    /// output into `dst`, stream-ordered after the last replay on the
    /// backend's stream (its device's [`kernel_rt::Gpu::shared_on`] handle); no host sync, so a
    /// caller can read results back while the next step runs.
    ///
    /// # Errors
    /// [`BackendError::UnknownLayer`]; [`BackendError::GraphUnsupported`]
    /// (CPU executor, no graph state); [`BackendError::Kernel`] when the
    /// rows exceed the graph output or `dst`.
    pub fn copy_graph_output(
        &self,
        layer: usize,
        row0: usize,
        rows: usize,
        dst: &mut kernel_rt::cudarc::driver::CudaViewMut<'_, u16>,
    ) -> Result<()> {
        let core = self.core();
        let plan = core.plans.get(layer).ok_or(BackendError::UnknownLayer {
            layer,
            num_layers: core.plans.len(),
        })?;
        graphs_of(core.executor.as_ref())?.copy_graph_output(plan, row0, rows, dst)
    }
}
