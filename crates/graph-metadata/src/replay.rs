//! Host-side replay preparation: pads a batch of real rows to its bucket
//! (SEMANTICS.md §graph-metadata.4, DESIGN.md D3).

use kernel_rt::{KernelError, Result};

/// `seq_lens` of a padding row: the backend's declared CUDA-graph fill value.
pub const SEQ_LEN_FILL: i64 = 1;
/// `req_pool_indices` of a padding row: request row 0, the reserved all-zero
/// row of `req_to_token` (D3: reset on every replay, never stale).
pub const PAD_REQUEST_INDEX: i64 = 0;
/// `out_cache_loc` of a padding token: slot 0, the dummy slot.
pub const PAD_OUT_CACHE_LOC: i64 = 0;

/// The whole contents of a bucket's input buffers for one replay: copy each
/// vector over the buffer bound at capture before launching the graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayInputs {
    /// `[bs]` i64: real rows, then [`PAD_REQUEST_INDEX`].
    pub req_pool_indices: Vec<i64>,
    /// `[bs]` i64 tokens: real rows, then [`SEQ_LEN_FILL`].
    pub seq_lens: Vec<i64>,
    /// `[num_tokens]` i64 slots: real tokens, then [`PAD_OUT_CACHE_LOC`].
    pub out_cache_loc: Vec<i64>,
}

/// Pads `raw_bs = req_pool_indices.len()` real rows to a bucket of `bs` rows
/// and the real tokens' `out_cache_loc` to the bucket's `num_tokens`. Every
/// entry of the result is set, so nothing from an earlier (larger) replay
/// survives in the buffers it is copied into. Pure: no device access.
///
/// # Errors
/// [`KernelError::Shape`] when `seq_lens` and `req_pool_indices` differ in
/// length; [`KernelError::Capacity`] when the rows exceed `bs` or the tokens
/// exceed `num_tokens`.
pub fn prepare_replay(
    bs: usize,
    num_tokens: usize,
    req_pool_indices: &[i64],
    seq_lens: &[i64],
    out_cache_loc: &[i64],
) -> Result<ReplayInputs> {
    let raw_bs = req_pool_indices.len();
    if seq_lens.len() != raw_bs {
        return Err(KernelError::shape(
            "seq_lens",
            format!("[raw_bs={raw_bs}] (as req_pool_indices)"),
            format!("[{}]", seq_lens.len()),
        ));
    }
    if raw_bs > bs {
        return Err(KernelError::Capacity {
            arg: "req_pool_indices",
            needed: raw_bs,
            available: bs,
        });
    }
    if out_cache_loc.len() > num_tokens {
        return Err(KernelError::Capacity {
            arg: "out_cache_loc",
            needed: out_cache_loc.len(),
            available: num_tokens,
        });
    }
    let pad = |src: &[i64], len: usize, fill: i64| {
        let mut v = Vec::with_capacity(len);
        v.extend_from_slice(src);
        v.resize(len, fill);
        v
    };
    Ok(ReplayInputs {
        req_pool_indices: pad(req_pool_indices, bs, PAD_REQUEST_INDEX),
        seq_lens: pad(seq_lens, bs, SEQ_LEN_FILL),
        out_cache_loc: pad(out_cache_loc, num_tokens, PAD_OUT_CACHE_LOC),
    })
}

/// Ragged verify: pads `real_bs = verify_lens.len()` per-request query
/// lengths to `bs` rows so they sum to the graph's token bucket
/// `graph_num_tokens` (SEMANTICS.md §backend.5 step 1, full-coverage variant):
/// `leftover = graph_num_tokens − Σ verify_lens` is spread over the padding
/// rows (row `k` gets `leftover / pads + (k < leftover % pads)`), or added to
/// the last real row when there is no padding row. Pure.
///
/// # Errors
/// [`KernelError::Capacity`] when `real_bs > bs` or the lengths exceed the
/// bucket; [`KernelError::Unsupported`] when `verify_lens` is empty while
/// tokens are left over, a length is negative, or a padded length exceeds `i32`.
pub fn pad_ragged_verify_lens(
    verify_lens: &[i32],
    graph_num_tokens: usize,
    bs: usize,
) -> Result<Vec<i32>> {
    let real_bs = verify_lens.len();
    if real_bs > bs {
        return Err(KernelError::Capacity {
            arg: "verify_lens",
            needed: real_bs,
            available: bs,
        });
    }
    if verify_lens.iter().any(|&l| l < 0) {
        return Err(KernelError::unsupported(
            "verify_lens",
            "lengths must be ≥ 0",
        ));
    }
    let sum: usize = verify_lens.iter().map(|&l| l as usize).sum();
    if sum > graph_num_tokens {
        return Err(KernelError::Capacity {
            arg: "verify_lens",
            needed: sum,
            available: graph_num_tokens,
        });
    }
    let leftover = graph_num_tokens - sum;
    let pads = bs - real_bs;
    let fit = |v: usize| {
        i32::try_from(v).map_err(|_| {
            KernelError::unsupported("graph_num_tokens", format!("length {v} exceeds i32"))
        })
    };
    let mut out = verify_lens.to_vec();
    if pads > 0 {
        for k in 0..pads {
            out.push(fit(leftover / pads + usize::from(k < leftover % pads))?);
        }
    } else if leftover > 0 {
        let last = out.last_mut().ok_or_else(|| {
            KernelError::unsupported("verify_lens", "no row to absorb the leftover tokens")
        })?;
        *last = fit(*last as usize + leftover)?;
    }
    Ok(out)
}

/// Checks padded ragged-verify lengths against the attention kernel's
/// `max_q_len` (SEMANTICS.md §backend.5 decision: validate on the host when the
/// lengths are known; the kernel clamps and counts otherwise).
///
/// # Errors
/// [`KernelError::Unsupported`] naming the first row longer than `max_q_len`.
pub fn check_ragged_q_lens(padded_lens: &[i32], max_q_len: u32) -> Result<()> {
    match padded_lens
        .iter()
        .position(|&l| l < 0 || l as u32 > max_q_len)
    {
        Some(i) => Err(KernelError::unsupported(
            "verify_lens",
            format!(
                "row {i} has {} query rows, more than max_q_len = {max_q_len}",
                padded_lens[i]
            ),
        )),
        None => Ok(()),
    }
}
