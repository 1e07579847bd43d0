//! Validation of one decode / verify call and its launch plan (params,
//! entry, geometry, workspace).

use kernel_rt::{to_i32, to_i64, KernelError, Result, MAX_GRID_YZ};

use crate::context::CONTEXT_MAX_Q_LEN;

use crate::reference::Interleave;

use super::views::{
    check_sinks_and_scales, check_vector, stride_err, validate_views, view_strides, ViewShapes,
};
use super::{
    entry_name, launch_config, mma_entry_name, mma_smem_bytes, mma_strides_fit, mma_supported,
    mma_tile_tokens, mma_wide, smem_bytes, workspace_elems, DecodeArgs, KernelPath, LaunchPlan,
    PagedAttentionParams, QueryLayout, SplitMode, MAX_Q_LEN, ROWS_PER_CTA, TILE_TOKENS, WINDOW_CAP,
};

/// Validates `args` for a GPU with `num_sms` SMs and derives the launch plan.
/// Every rejection happens here, before any launch (D15).
///
/// # Errors
/// [`KernelError::Shape`], [`KernelError::Stride`],
/// [`KernelError::Unsupported`] or [`KernelError::Capacity`] (workspace)
/// naming the argument.
pub fn validate(args: &DecodeArgs<'_>, num_sms: usize) -> Result<LaunchPlan> {
    validate_path(args, num_sms, KernelPath::Auto)
}

/// [`validate`] for an explicit [`KernelPath`].
///
/// # Errors
/// As [`validate`].
pub fn validate_path(
    args: &DecodeArgs<'_>,
    num_sms: usize,
    path: KernelPath,
) -> Result<LaunchPlan> {
    plan_path(args, num_sms, path, true, false, false)
}

/// The launch plan; `check_workspace = false` skips only the workspace
/// capacity check (so a caller can size the workspace from the plan).
/// `long_rows` (the context call's head-dim-512 path): a ragged `max_q_len`
/// up to [`CONTEXT_MAX_Q_LEN`] instead of [`MAX_Q_LEN`], and the grid's y
/// dimension covers at most `⌊65535 / Hkv⌋` row tiles (the launcher issues
/// one launch per such block of row tiles, `row_tile_base` apart);
/// `params.row_tiles` stays the total. `wide_mma`: [`KernelPath::Auto`]
/// also takes the tensor-core entries of [`mma_wide`] shapes
/// ([`crate::PagedAttentionKernel::set_wide_mma`]; [`validate`] plans
/// without them).
pub(super) fn plan_path(
    args: &DecodeArgs<'_>,
    num_sms: usize,
    path: KernelPath,
    check_workspace: bool,
    long_rows: bool,
    wide_mma: bool,
) -> Result<LaunchPlan> {
    let ViewShapes {
        num_tokens,
        hq,
        dim,
        num_pages,
        hkv,
        page_size,
        group,
        bs,
        m,
    } = validate_views(
        &args.q,
        &args.out,
        &args.kv,
        &args.page_table,
        &args.cache_seqlens,
    )?;
    let q_len = match &args.layout {
        QueryLayout::Uniform { q_len_per_req } => {
            if !(1..=MAX_Q_LEN).contains(q_len_per_req) {
                return Err(KernelError::unsupported(
                    "q_len_per_req",
                    format!("{q_len_per_req} (supported 1..=16)"),
                ));
            }
            if num_tokens != bs * q_len_per_req {
                return Err(KernelError::shape(
                    "q",
                    format!("[bs·q_len_per_req = {}, Hq, D]", bs * q_len_per_req),
                    format!("{:?}", args.q.shape()),
                ));
            }
            *q_len_per_req
        }
        QueryLayout::Ragged {
            cu_seqlens_q,
            max_q_len,
        } => {
            let cap = if long_rows {
                CONTEXT_MAX_Q_LEN
            } else {
                MAX_Q_LEN
            };
            if !(1..=cap).contains(max_q_len) {
                return Err(KernelError::unsupported(
                    "max_q_len",
                    format!("{max_q_len} (supported 1..={cap})"),
                ));
            }
            check_vector("cu_seqlens_q", cu_seqlens_q, bs + 1)?;
            *max_q_len
        }
    };
    check_sinks_and_scales(args.sinks.as_ref(), hq, args.bmm1_scale, args.bmm2_scale)?;
    if args.max_seq_len == 0 || args.max_seq_len >= WINDOW_CAP as usize {
        return Err(KernelError::unsupported(
            "max_seq_len",
            format!("{} (supported 1..2^30)", args.max_seq_len),
        ));
    }
    if let SplitMode::Fixed { chunk_tokens } | SplitMode::Chunked { chunk_tokens, .. } = args.split
    {
        if chunk_tokens == 0 || chunk_tokens >= WINDOW_CAP as usize {
            return Err(KernelError::unsupported(
                "split",
                "chunk_tokens must be in 1..2^30",
            ));
        }
    }
    if let SplitMode::Chunked { max_splits, .. } = args.split {
        if max_splits == 0 || max_splits > i32::MAX as usize {
            return Err(KernelError::unsupported(
                "split",
                "max_splits must be in 1..2^31",
            ));
        }
    }
    let row_tiles = (q_len * group).div_ceil(ROWS_PER_CTA);
    let st = view_strides(&args.q, &args.out, &args.kv, &args.page_table, bs, m)?;
    let use_mma = path == KernelPath::Auto
        && mma_supported(args.q_dtype, args.kv.dtype(), dim)
        && (wide_mma || !mma_wide(args.kv.dtype(), dim))
        && mma_strides_fit(st.k, st.v, args.kv.dtype().size() as i64);
    let (cp_ranks, cp_rank) =
        interleave_params(args.interleave, page_size, m, args.sinks.is_some(), use_mma)?;
    let (smem, entry, tile_tokens) = if use_mma {
        (
            mma_smem_bytes(dim, args.kv.dtype()),
            mma_entry_name(args.q_dtype, args.kv.dtype(), dim),
            mma_tile_tokens(dim, args.kv.dtype()),
        )
    } else {
        (
            smem_bytes(dim, args.kv.dtype()),
            entry_name(args.q_dtype, args.kv.dtype(), dim),
            TILE_TOKENS,
        )
    };
    let grid_row_tiles = if long_rows {
        row_tiles.min(MAX_GRID_YZ as usize / hkv.max(1)).max(1)
    } else {
        row_tiles
    };
    let (max_splits, config) = launch_config(
        bs,
        hkv,
        grid_row_tiles,
        args.max_seq_len,
        args.split,
        num_sms,
        smem,
    )?;
    let workspace_elems = workspace_elems(bs, hkv, row_tiles, max_splits, dim);
    if check_workspace && workspace_elems > 0 {
        let have = args.workspace.as_ref().map_or(0, |w| w.shape()[0]);
        if have < workspace_elems {
            return Err(KernelError::Capacity {
                arg: "workspace",
                needed: workspace_elems,
                available: have,
            });
        }
        if let Some(w) = &args.workspace {
            if w.strides()[0] != 1 {
                return Err(stride_err("workspace", "must be contiguous".into()));
            }
        }
    }
    let window = args
        .window_left
        .filter(|&w| w < WINDOW_CAP)
        .map_or(-1, |w| w as i32);
    let lse_stride_tok = lse_stride_tok(args.lse.as_ref(), num_tokens, hq)?;
    let params = PagedAttentionParams {
        lse_stride_tok,
        q_stride_tok: st.q[0],
        q_stride_head: st.q[1],
        o_stride_tok: st.out[0],
        o_stride_head: st.out[1],
        k_stride_page: st.k[0],
        k_stride_head: st.k[1],
        k_stride_tok: st.k[2],
        v_stride_page: st.v[0],
        v_stride_head: st.v[1],
        v_stride_tok: st.v[2],
        page_table_stride: st.page_table,
        bs: to_i32("bs", bs)?,
        num_q_heads: to_i32("q", hq)?,
        num_kv_heads: to_i32("k_cache", hkv)?,
        group: to_i32("q", group)?,
        page_size: to_i32("page_size", page_size)?,
        max_num_pages: to_i32("page_table", m)?,
        num_pages: to_i32("k_cache", num_pages)?,
        num_tokens: to_i32("q", num_tokens)?,
        q_len: to_i32("q_len", q_len)?,
        row_tiles: to_i32("q_len", row_tiles)?,
        max_splits: to_i32("max_splits", max_splits)?,
        fixed_chunk: match args.split {
            SplitMode::Auto => 0,
            SplitMode::Fixed { chunk_tokens } | SplitMode::Chunked { chunk_tokens, .. } => {
                to_i32("split", chunk_tokens)?
            }
        },
        window_left: window,
        scale_log2: args.bmm1_scale * std::f32::consts::LOG2_E,
        bmm2_scale: args.bmm2_scale,
        tile_tokens: tile_tokens as i32,
        cp_ranks,
        cp_rank,
        skip_log2_factor: skip_log2_factor(args.skip_softmax)?,
        ..Default::default()
    };
    Ok(LaunchPlan {
        params,
        entry,
        config,
        workspace_elems,
        head_dim: dim,
        kv_dtype: args.kv.dtype(),
    })
}

/// `(cp_ranks, cp_rank)` of the params from [`DecodeArgs::interleave`]
/// (`(1, 0)` without one or with one rank), for a launch of `page_size`,
/// `m` page-table columns, with or without sinks, on the tensor-core kernel
/// or not.
///
/// # Errors
/// [`KernelError::Unsupported`] for `rank ≥ ranks`, a block other than the
/// page size, sinks with more than one rank (they join after the merge), a
/// launch the tensor-core kernel cannot take, or columns past `i32`.
pub(crate) fn interleave_params(
    interleave: Option<Interleave>,
    page_size: usize,
    m: usize,
    sinks: bool,
    use_mma: bool,
) -> Result<(i32, i32)> {
    let Some(il) = interleave.filter(|il| il.ranks > 1) else {
        return Ok((1, 0));
    };
    let err = |detail: String| Err(KernelError::unsupported("interleave", detail));
    if il.rank >= il.ranks {
        return err(format!("rank {} of {} ranks", il.rank, il.ranks));
    }
    if il.block != page_size {
        return err(format!(
            "block {} must be the page size {page_size} (pages are dealt whole)",
            il.block
        ));
    }
    if sinks {
        return err("sinks join once after the ranks' states are merged: pass None".into());
    }
    if !use_mma {
        return err(
            "the page interleave runs on the tensor-core kernel only (16-bit Q, D 64 / 128 / \
             256, K/V byte strides within i32)"
                .into(),
        );
    }
    // Local pages up to ceil(M / N) map to columns below M + N.
    to_i32("interleave", m + il.ranks)?;
    Ok((to_i32("interleave", il.ranks)?, il.rank as i32))
}

/// `log2(f)` of a skip-softmax factor (`−inf` for `None` or 0: off).
///
/// # Errors
/// [`KernelError::Unsupported`] for a negative or non-finite factor.
pub(crate) fn skip_log2_factor(factor: Option<f32>) -> Result<f32> {
    match factor {
        None => Ok(f32::NEG_INFINITY),
        Some(f) if f.is_finite() && f >= 0.0 => Ok(f.log2()),
        Some(f) => Err(KernelError::unsupported(
            "skip_softmax",
            format!("{f} (a finite factor ≥ 0; 0 or None: exact attention)"),
        )),
    }
}

/// The row stride of an optional LSE output `[num_tokens, Hq]` f32 (0
/// without one), shared by the decode and context launchers.
///
/// # Errors
/// [`KernelError::Shape`] for another shape; [`KernelError::Stride`] for a
/// last dim that is not contiguous or a row stride past `i64`.
pub(crate) fn lse_stride_tok(
    lse: Option<&kernel_rt::StridedMut<'_, f32, 2>>,
    num_tokens: usize,
    hq: usize,
) -> Result<i64> {
    let Some(l) = lse else {
        return Ok(0);
    };
    if l.shape() != [num_tokens, hq] {
        return Err(KernelError::shape(
            "lse",
            format!("[num_tokens={num_tokens}, Hq={hq}]"),
            format!("{:?}", l.shape()),
        ));
    }
    l.require_last_contiguous()?;
    to_i64("lse", l.strides()[0])
}

#[cfg(test)]
mod tests {
    use super::interleave_params;
    use crate::reference::Interleave;

    fn il(rank: usize, ranks: usize, block: usize) -> Option<Interleave> {
        Some(Interleave { rank, ranks, block })
    }

    #[test]
    fn skip_factor_zero_is_off_and_bad_factors_are_refused() {
        use super::skip_log2_factor;
        assert_eq!(skip_log2_factor(None).unwrap(), f32::NEG_INFINITY);
        assert_eq!(skip_log2_factor(Some(0.0)).unwrap(), f32::NEG_INFINITY);
        assert_eq!(skip_log2_factor(Some(4.0)).unwrap(), 2.0);
        for bad in [-1.0, f32::NAN, f32::INFINITY] {
            assert!(skip_log2_factor(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn interleave_params_off_by_default_and_checked() {
        assert_eq!(interleave_params(None, 16, 8, true, false).unwrap(), (1, 0));
        // One rank is the unsplit call (sinks and any kernel allowed).
        assert_eq!(
            interleave_params(il(0, 1, 16), 16, 8, true, false).unwrap(),
            (1, 0)
        );
        assert_eq!(
            interleave_params(il(2, 4, 16), 16, 8, false, true).unwrap(),
            (4, 2)
        );
        let refused = [
            il(4, 4, 16), // rank past the ranks
            il(0, 2, 1),  // a block other than the page
        ];
        for r in refused {
            let e = interleave_params(r, 16, 8, false, true).unwrap_err();
            assert!(e.to_string().contains("interleave"), "{e}");
        }
        let e = interleave_params(il(1, 2, 16), 16, 8, true, true).unwrap_err();
        assert!(e.to_string().contains("sinks"), "{e}");
        let e = interleave_params(il(1, 2, 16), 16, 8, false, false).unwrap_err();
        assert!(e.to_string().contains("tensor-core"), "{e}");
        assert!(interleave_params(il(1, 2, 16), 16, i32::MAX as usize, false, true).is_err());
    }
}
