//! The metadata build: the buffers a pass (or the graph state) builds its
//! metadata into (`MetaBufs`), their host inputs (`MetaInputs`), and the
//! fused graph-metadata launch (`launch_metadata*`, `meta_mode`).

use std::sync::Arc;

use graph_metadata::{GraphMetadataArgs, GraphMetadataKernel, GraphMode, SwaArgs, SwaWriteLocs};
use kernel_rt::cudarc::driver::{CudaSlice, CudaStream};
use kernel_rt::{DeviceErrors, Strided, StridedMut};

use crate::batch::AttnMode;
use crate::error::Result;
use crate::executor::DeviceMetadata;

use super::mirrors::{read, upload, zeros, Maps};

/// Metadata inputs and outputs of one pass (eager) or of the graph state.
#[derive(Debug)]
pub(super) struct MetaBufs {
    pub(super) cap_bs: usize,
    pub(super) cap_tokens: usize,
    pub(super) m: usize,
    rpi: CudaSlice<i64>,
    seq: CudaSlice<i64>,
    qlens: CudaSlice<i32>,
    pub(super) out_loc: CudaSlice<i64>,
    pub(super) cache: CudaSlice<i32>,
    pub(super) cu_k: CudaSlice<i32>,
    pub(super) cu_q: CudaSlice<i32>,
    pub(super) pt: CudaSlice<i32>,
    pub(super) swa_pt: Option<CudaSlice<i32>>,
    pub(super) swa_out: Option<CudaSlice<i64>>,
}

impl MetaBufs {
    pub(super) fn new(
        stream: &Arc<CudaStream>,
        cap_bs: usize,
        cap_tokens: usize,
        m: usize,
        swa: bool,
    ) -> Result<Self> {
        Ok(Self {
            cap_bs,
            cap_tokens,
            m,
            rpi: zeros(stream, cap_bs)?,
            seq: zeros(stream, cap_bs)?,
            qlens: zeros(stream, cap_bs)?,
            out_loc: zeros(stream, cap_tokens)?,
            cache: zeros(stream, cap_bs)?,
            cu_k: zeros(stream, cap_bs + 1)?,
            cu_q: zeros(stream, cap_bs + 1)?,
            pt: zeros(stream, cap_bs * m)?,
            swa_pt: if swa {
                Some(zeros(stream, cap_bs * m)?)
            } else {
                None
            },
            swa_out: if swa {
                Some(zeros(stream, cap_tokens)?)
            } else {
                None
            },
        })
    }

    pub(super) fn read(
        &self,
        stream: &Arc<CudaStream>,
        bs: usize,
        n_tokens: usize,
    ) -> Result<DeviceMetadata> {
        Ok(DeviceMetadata {
            cache_seqlens: read(stream, &self.cache, bs)?,
            cu_seqlens_q: read(stream, &self.cu_q, bs + 1)?,
            cu_seqlens_k: read(stream, &self.cu_k, bs + 1)?,
            page_table: read(stream, &self.pt, bs * self.m)?,
            swa_page_table: self
                .swa_pt
                .as_ref()
                .map(|t| read(stream, t, bs * self.m))
                .transpose()?,
            swa_out_cache_loc: self
                .swa_out
                .as_ref()
                .map(|t| read(stream, t, n_tokens))
                .transpose()?,
        })
    }
}

/// Host inputs of one metadata build, uploaded into a [`MetaBufs`].
pub(super) struct MetaInputs<'a> {
    pub(super) req_pool_indices: &'a [i64],
    pub(super) seq_lens: &'a [i64],
    pub(super) out_cache_loc: &'a [i64],
    /// `[bs]` ragged-verify lengths.
    pub(super) qlens: Option<&'a [i32]>,
    /// `[bs+1]` host `cu_seqlens_q` (extend-like modes).
    pub(super) cu_q: Option<&'a [i32]>,
}

impl MetaInputs<'_> {
    pub(super) fn upload(&self, stream: &Arc<CudaStream>, b: &mut MetaBufs) -> Result<()> {
        upload(stream, self.req_pool_indices, &mut b.rpi)?;
        upload(stream, self.seq_lens, &mut b.seq)?;
        upload(stream, self.out_cache_loc, &mut b.out_loc)?;
        if let Some(q) = self.qlens {
            upload(stream, q, &mut b.qlens)?;
        }
        if let Some(q) = self.cu_q {
            upload(stream, q, &mut b.cu_q)?;
        }
        Ok(())
    }
}

/// The graph-metadata mode, whether the kernel writes `cu_seqlens_q`, and
/// whether it reads `qlens`, for a branch.
pub(super) fn meta_mode(mode: AttnMode, max_q: usize) -> Result<(GraphMode, bool)> {
    Ok(match mode {
        AttnMode::Decode => (GraphMode::Decode, true),
        AttnMode::DraftDecode { step } => (GraphMode::DraftDecode { step }, true),
        AttnMode::TargetVerify { q_len } => (
            GraphMode::TargetVerify {
                q_len: q_len as u32,
            },
            true,
        ),
        AttnMode::DraftExtendV2 { q_len } => (
            GraphMode::DraftExtendV2 {
                q_len: q_len as u32,
            },
            true,
        ),
        AttnMode::RaggedVerify => (
            GraphMode::RaggedVerify {
                max_q_len: max_q.max(1) as u32,
            },
            true,
        ),
        // Offset 0 gives cache_seqlens = seq_lens; cu_seqlens_q is uploaded.
        AttnMode::Extend => (GraphMode::Decode, false),
    })
}

/// The inputs of one fused metadata launch (the executor's own buffers or
/// an engine's views): `[bs]` request rows and lengths, `[n]` write slots,
/// `[bs]` ragged lengths, `req_to_token`, the SWA maps.
pub(super) struct MetaIn<'a> {
    pub(super) rpi: Strided<'a, i64, 1>,
    pub(super) seq: Strided<'a, i64, 1>,
    pub(super) out_loc: Strided<'a, i64, 1>,
    pub(super) qlens: Option<Strided<'a, i32, 1>>,
    pub(super) r2t: Strided<'a, i32, 2>,
    pub(super) pool_slots: Option<usize>,
    pub(super) swa_map: Option<Strided<'a, i64, 1>>,
    pub(super) page_map: Option<Strided<'a, i32, 1>>,
}

impl<'a> MetaIn<'a> {
    /// The executor's device pool tables (`req_to_token`, SWA maps); the
    /// batch vectors are placeholders the caller replaces.
    fn own_tables(maps: &'a Maps) -> Result<Self> {
        let empty = |arg| Strided::contiguous(arg, maps.entries.slice(0..0), [0]);
        Ok(Self {
            rpi: empty("req_pool_indices")?,
            seq: empty("seq_lens")?,
            out_loc: empty("out_cache_loc")?,
            qlens: None,
            r2t: Strided::new(
                "req_to_token",
                maps.r2t.slice(0..maps.rows * maps.width),
                [maps.rows, maps.width],
                [maps.width, 1],
            )?,
            pool_slots: Some(maps.pool_slots),
            swa_map: maps
                .swa_map
                .as_ref()
                .map(|m| {
                    Strided::contiguous(
                        "swa_mapping",
                        m.slice(0..maps.swa_map_len),
                        [maps.swa_map_len],
                    )
                })
                .transpose()?,
            page_map: match &maps.page_map {
                Some(pm) if maps.page_map_len > 0 => Some(Strided::contiguous(
                    "full_page_to_swa_page",
                    pm.slice(0..maps.page_map_len),
                    [maps.page_map_len],
                )?),
                _ => None,
            },
        })
    }
}

/// One fused metadata launch over `b` (first `bs` rows, `n_tokens` tokens),
/// from the executor's own inputs.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_metadata(
    kernel: &GraphMetadataKernel,
    maps: &Maps,
    b: &mut MetaBufs,
    mode: GraphMode,
    write_cu_q: bool,
    bs: usize,
    n_tokens: usize,
    page_size: usize,
    errors: &mut DeviceErrors,
) -> Result<()> {
    if bs == 0 {
        return Ok(());
    }
    let ragged = matches!(mode, GraphMode::RaggedVerify { .. });
    let MetaBufs {
        m,
        rpi,
        seq,
        qlens,
        out_loc,
        cache,
        cu_k,
        cu_q,
        pt,
        swa_pt,
        swa_out,
        ..
    } = b;
    let input = MetaIn {
        rpi: Strided::contiguous("req_pool_indices", rpi.slice(0..bs), [bs])?,
        seq: Strided::contiguous("seq_lens", seq.slice(0..bs), [bs])?,
        out_loc: Strided::contiguous("out_cache_loc", out_loc.slice(0..n_tokens), [n_tokens])?,
        qlens: if ragged {
            Some(Strided::contiguous("qlens", qlens.slice(0..bs), [bs])?)
        } else {
            None
        },
        ..MetaIn::own_tables(maps)?
    };
    let out = MetaOut {
        m: *m,
        cache,
        cu_k,
        cu_q,
        pt,
        swa_pt: swa_pt.as_mut(),
        swa_out: swa_out.as_mut(),
    };
    launch_metadata_on(
        kernel, input, out, mode, write_cu_q, bs, n_tokens, page_size, errors,
    )
}

/// The outputs of one fused metadata launch.
pub(super) struct MetaOut<'a> {
    m: usize,
    cache: &'a mut CudaSlice<i32>,
    cu_k: &'a mut CudaSlice<i32>,
    cu_q: &'a mut CudaSlice<i32>,
    pt: &'a mut CudaSlice<i32>,
    swa_pt: Option<&'a mut CudaSlice<i32>>,
    swa_out: Option<&'a mut CudaSlice<i64>>,
}

impl<'a> MetaOut<'a> {
    pub(super) fn of(b: &'a mut MetaBufs) -> Self {
        Self {
            m: b.m,
            cache: &mut b.cache,
            cu_k: &mut b.cu_k,
            cu_q: &mut b.cu_q,
            pt: &mut b.pt,
            swa_pt: b.swa_pt.as_mut(),
            swa_out: b.swa_out.as_mut(),
        }
    }
}

/// One fused metadata launch from `input` into `out` (first `bs` rows,
/// `n_tokens` tokens).
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_metadata_on(
    kernel: &GraphMetadataKernel,
    input: MetaIn<'_>,
    out: MetaOut<'_>,
    mode: GraphMode,
    write_cu_q: bool,
    bs: usize,
    n_tokens: usize,
    page_size: usize,
    errors: &mut DeviceErrors,
) -> Result<()> {
    if bs == 0 {
        return Ok(());
    }
    let m = out.m;
    let MetaIn {
        rpi,
        seq,
        out_loc,
        qlens,
        r2t,
        pool_slots,
        swa_map,
        page_map,
    } = input;
    let swa = match (swa_map, out.swa_pt) {
        (Some(map), Some(swa_pt)) => Some(SwaArgs {
            swa_mapping: map,
            swa_page_table: Some(StridedMut::new(
                "swa_page_table",
                swa_pt.slice_mut(0..bs * m),
                [bs, m],
                [m, 1],
            )?),
            full_page_to_swa_page: page_map,
            write_locs: match out.swa_out {
                Some(o) if n_tokens > 0 => Some(SwaWriteLocs {
                    out_cache_loc: Some(out_loc),
                    swa_out_cache_loc: StridedMut::contiguous(
                        "swa_out_cache_loc",
                        o.slice_mut(0..n_tokens),
                        [n_tokens],
                    )?,
                }),
                _ => None,
            },
        }),
        _ => None,
    };
    let mut args = GraphMetadataArgs {
        mode,
        req_pool_indices: rpi,
        seq_lens: seq,
        req_to_token: r2t,
        page_size,
        pool_slots,
        cache_seqlens: StridedMut::contiguous("cache_seqlens", out.cache.slice_mut(0..bs), [bs])?,
        cu_seqlens_k: StridedMut::contiguous(
            "cu_seqlens_k",
            out.cu_k.slice_mut(0..bs + 1),
            [bs + 1],
        )?,
        cu_seqlens_q: if write_cu_q {
            Some(StridedMut::contiguous(
                "cu_seqlens_q",
                out.cu_q.slice_mut(0..bs + 1),
                [bs + 1],
            )?)
        } else {
            None
        },
        qlens,
        page_table: StridedMut::new("page_table", out.pt.slice_mut(0..bs * m), [bs, m], [m, 1])?,
        swa,
    };
    kernel.launch(&mut args, errors)?;
    Ok(())
}

pub(super) fn ragged_lens(cu: &[i32]) -> Vec<i32> {
    cu.windows(2).map(|w| w[1] - w[0]).collect()
}
