//! The CPU executor: host K/V caches, fp8-kv's write references and
//! paged-attention's f64 reference.

use fp8_kv::KvCacheDtype;
use kernel_rt::{ErrorReport, KernelError};
use paged_attention::reference::{self as attn, HostKv, HostLayout, KvData};
use paged_attention::HalfDtype;

use crate::batch::AttnMode;
use crate::engine::{EngineBatch, EngineKvCache, EngineLayer, EngineShape};
use crate::error::{BackendError, Result};
use crate::metadata::ForwardMetadata;

use super::{
    bmm_scales, copy_pages_in, copy_pages_out, page_dtype_err, Executor, ExecutorKind, KvLoc,
    KvSnapshot, LayerPlan, Tensor, TensorRef,
};

#[derive(Debug, Clone)]
enum Store {
    Half(Vec<u16>, Vec<u16>),
    Fp8(Vec<u8>, Vec<u8>),
}

/// The CPU executor: host K/V caches, fp8-kv's write references and
/// paged-attention's f64 reference (output rounded to the model dtype).
#[derive(Debug, Clone)]
pub struct CpuExecutor {
    model_dtype: HalfDtype,
    layers: Vec<Store>,
    /// Simulated decode context-parallel ranks (1 = off).
    decode_cp: usize,
}

impl CpuExecutor {
    /// Zeroed caches for `plans` (one per layer, in order).
    pub fn new(model_dtype: HalfDtype, kv_dtype: KvCacheDtype, plans: &[LayerPlan]) -> Self {
        let layers = plans
            .iter()
            .map(|p| {
                let n = p.slots * p.num_kv_heads * p.head_dim;
                match kv_dtype {
                    KvCacheDtype::Fp8E4m3 => Store::Fp8(vec![0; n], vec![0; n]),
                    _ => Store::Half(vec![0; n], vec![0; n]),
                }
            })
            .collect();
        Self {
            model_dtype,
            layers,
            decode_cp: 1,
        }
    }

    /// Runs the decode-kernel passes (decode, draft decode, target verify,
    /// draft extend) as `ranks` simulated decode context-parallel ranks
    /// ([`paged_attention::cp::simulate`]: page interleave, partial states
    /// merged, sinks joined once); extend / mixed passes stay unsplit.
    /// `ranks ≤ 1` = off (the default).
    #[must_use]
    pub fn with_decode_cp(mut self, ranks: usize) -> Self {
        self.decode_cp = ranks.max(1);
        self
    }

    /// The reference attention of a pass: split over the simulated ranks
    /// when the pass runs the decode kernel, else unsplit.
    fn reference(&self, input: &attn::HostInputs<'_>, mode: AttnMode) -> attn::RefOutput {
        if self.decode_cp > 1 && mode.uses_decode_kernel() {
            paged_attention::cp::simulate(input, self.decode_cp)
        } else {
            attn::attention(input)
        }
    }
}

/// The reference's query layout of a pass.
fn host_layout(meta: &ForwardMetadata) -> HostLayout<'_> {
    match meta.mode {
        AttnMode::Decode | AttnMode::DraftDecode { .. } => HostLayout::Uniform { q_len_per_req: 1 },
        AttnMode::TargetVerify { q_len } | AttnMode::DraftExtendV2 { q_len } => {
            HostLayout::Uniform {
                q_len_per_req: q_len,
            }
        }
        AttnMode::RaggedVerify | AttnMode::Extend => HostLayout::Ragged {
            cu_seqlens_q: &meta.cu_seqlens_q,
            max_q_len: meta.max_seq_len_q,
        },
    }
}

fn host<'a>(t: TensorRef<'a>, arg: &'static str) -> Result<&'a [u16]> {
    match t {
        TensorRef::Host(s) => Ok(s),
        TensorRef::Device(_) => Err(KernelError::unsupported(
            arg,
            "the CPU executor takes host tensors, not device memory",
        )
        .into()),
    }
}

impl Executor for CpuExecutor {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::Cpu
    }

    fn write_kv(
        &mut self,
        plan: &LayerPlan,
        loc: KvLoc<'_>,
        k: TensorRef<'_>,
        v: TensorRef<'_>,
    ) -> Result<ErrorReport> {
        let loc = loc.slots;
        let (k, v) = (host(k, "k")?, host(v, "v")?);
        let row = plan.num_kv_heads * plan.head_dim;
        let w = fp8_kv::reference::HostWrite {
            cache_loc: loc,
            num_kv_heads: plan.num_kv_heads,
            head_dim: plan.head_dim,
            k: fp8_kv::reference::HostRows {
                data: k,
                token_stride: row,
                head_stride: plan.head_dim,
            },
            v: fp8_kv::reference::HostRows {
                data: v,
                token_stride: row,
                head_stride: plan.head_dim,
            },
        };
        fn cache<'a, C>(
            data: &'a mut [C],
            plan: &LayerPlan,
        ) -> fp8_kv::reference::HostCache<'a, C> {
            fp8_kv::reference::HostCache {
                data,
                slots: plan.slots,
                slot_stride: plan.num_kv_heads * plan.head_dim,
                head_stride: plan.head_dim,
            }
        }
        Ok(match &mut self.layers[plan.layer] {
            Store::Half(kc, vc) => {
                fp8_kv::reference::set_kv_buffer(&w, &mut cache(kc, plan), &mut cache(vc, plan))
            }
            Store::Fp8(kc, vc) => {
                let dtype = match self.model_dtype {
                    HalfDtype::Bf16 => fp8_kv::KvDtype::Bf16,
                    HalfDtype::F16 => fp8_kv::KvDtype::F16,
                };
                fp8_kv::reference::fused_fp8_set_kv_buffer(
                    &w,
                    dtype,
                    &plan.scales,
                    &mut cache(kc, plan),
                    &mut cache(vc, plan),
                )
            }
        })
    }

    fn attention(
        &mut self,
        plan: &LayerPlan,
        meta: &ForwardMetadata,
        page_size: usize,
        q: TensorRef<'_>,
    ) -> Result<(Tensor, ErrorReport)> {
        let q = host(q, "q")?;
        let (hq, hkv, d) = (plan.num_q_heads, plan.num_kv_heads, plan.head_dim);
        let rows = meta.num_tokens;
        if rows == 0 || meta.batch_size == 0 {
            return Ok((Tensor::Host(vec![0; rows * hq * d]), ErrorReport::default()));
        }
        let pages = plan.slots / page_size;
        let shape = [pages, hkv, page_size, d];
        let strides = [page_size * hkv * d, d, hkv * d, 1];
        let (kd, vd) = match &self.layers[plan.layer] {
            Store::Half(k, v) => match self.model_dtype {
                HalfDtype::Bf16 => (KvData::Bf16(k), KvData::Bf16(v)),
                HalfDtype::F16 => (KvData::F16(k), KvData::F16(v)),
            },
            Store::Fp8(k, v) => (KvData::E4m3(k), KvData::E4m3(v)),
        };
        let table = if plan.is_swa {
            meta.swa_page_table.as_deref().unwrap_or(&meta.page_table)
        } else {
            &meta.page_table
        };
        let layout = host_layout(meta);
        let (bmm1, bmm2) = plan.scales.bmm_scales(1.0, plan.sm_scale);
        let input = attn::HostInputs {
            q,
            q_dtype: self.model_dtype,
            q_shape: [rows, hq, d],
            q_strides: [hq * d, d, 1],
            k: HostKv {
                data: kd,
                shape,
                strides,
            },
            v: HostKv {
                data: vd,
                shape,
                strides,
            },
            page_table: table,
            max_num_pages: meta.max_num_pages,
            page_table_stride: meta.max_num_pages,
            cache_seqlens: &meta.cache_seqlens,
            layout,
            bmm1_scale: bmm1,
            bmm2_scale: bmm2,
            window_left: plan.window_left,
            sinks: plan.sinks.as_deref(),
        };
        let r = self.reference(&input, meta.mode);
        let dt = self.model_dtype;
        let out = r.out.iter().map(|&x| dt.from_f64(x)).collect();
        Ok((Tensor::Host(out), r.errors))
    }

    fn engine_forward(
        &mut self,
        plan: &LayerPlan,
        shape: &EngineShape,
        batch: &EngineBatch<'_>,
        io: &mut EngineLayer<'_>,
        save_kv: bool,
    ) -> Result<crate::DeviceErrorReport> {
        let _ = batch;
        let meta = shape
            .host
            .as_ref()
            .ok_or_else(|| BackendError::Metadata("no host metadata of the engine pass".into()))?;
        let mut errors = crate::DeviceErrorReport::default();
        let (hq, hkv, d) = (plan.num_q_heads, plan.num_kv_heads, plan.head_dim);
        let [pages, _, page_size, _] = io.kv_cache.shape();
        if let (true, Some(k), Some(v)) = (save_kv, &io.k, &io.v) {
            let loc: &[i64] = match (&meta.swa_out_cache_loc, plan.is_swa) {
                (Some(s), true) => s,
                _ => &meta.source_out_cache_loc,
            };
            fn rows<'a>(
                t: &'a crate::engine::View<'_, u16, 3>,
                d: usize,
            ) -> Result<fp8_kv::reference::HostRows<'a>> {
                let [_, _, sd] = t.strides();
                if d > 1 && sd != 1 {
                    return Err(KernelError::Stride {
                        arg: t.arg(),
                        detail: "last dim must be contiguous".into(),
                    }
                    .into());
                }
                Ok(fp8_kv::reference::HostRows {
                    data: t.host()?,
                    token_stride: t.strides()[0],
                    head_stride: t.strides()[1],
                })
            }
            let w = fp8_kv::reference::HostWrite {
                cache_loc: loc,
                num_kv_heads: hkv,
                head_dim: d,
                k: rows(k, d)?,
                v: rows(v, d)?,
            };
            fn paged<'a, C>(
                view: &'a mut crate::engine::ViewMut<'_, C, 4>,
            ) -> Result<fp8_kv::reference::HostPagedCache<'a, C>> {
                let [pages, _, p, _] = view.shape();
                let [ps, hs, ts, _] = view.strides();
                Ok(fp8_kv::reference::HostPagedCache {
                    data: view.host_mut()?,
                    num_pages: pages,
                    page_size: p,
                    page_stride: ps,
                    head_stride: hs,
                    token_stride: ts,
                })
            }
            errors.kv_write.merge(match &mut io.kv_cache {
                EngineKvCache::Half { k, v } => {
                    fp8_kv::reference::set_kv_buffer_paged(&w, &mut paged(k)?, &mut paged(v)?)
                }
                EngineKvCache::E4m3 { k, v } => {
                    let dtype = match self.model_dtype {
                        HalfDtype::Bf16 => fp8_kv::KvDtype::Bf16,
                        HalfDtype::F16 => fp8_kv::KvDtype::F16,
                    };
                    fp8_kv::reference::fused_fp8_set_kv_buffer_paged(
                        &w,
                        dtype,
                        &plan.scales,
                        &mut paged(k)?,
                        &mut paged(v)?,
                    )
                }
            });
        }
        let rows = meta.num_tokens;
        let mut out = vec![0u16; rows * hq * d];
        if rows > 0 && meta.batch_size > 0 {
            let (kd, vd, kshape, kstr, vstr) = match &io.kv_cache {
                EngineKvCache::Half { k, v } => {
                    let (kh, vh) = (k.host()?, v.host()?);
                    match self.model_dtype {
                        HalfDtype::Bf16 => (
                            KvData::Bf16(kh),
                            KvData::Bf16(vh),
                            k.shape(),
                            k.strides(),
                            v.strides(),
                        ),
                        HalfDtype::F16 => (
                            KvData::F16(kh),
                            KvData::F16(vh),
                            k.shape(),
                            k.strides(),
                            v.strides(),
                        ),
                    }
                }
                EngineKvCache::E4m3 { k, v } => (
                    KvData::E4m3(k.host()?),
                    KvData::E4m3(v.host()?),
                    k.shape(),
                    k.strides(),
                    v.strides(),
                ),
            };
            let _ = (pages, page_size);
            let table = if plan.is_swa {
                meta.swa_page_table.as_deref().unwrap_or(&meta.page_table)
            } else {
                &meta.page_table
            };
            let layout = host_layout(meta);
            let (bmm1, bmm2) = bmm_scales(plan, io.q_scale);
            let input = attn::HostInputs {
                q: io.q.host()?,
                q_dtype: self.model_dtype,
                q_shape: [rows, hq, d],
                q_strides: io.q.strides(),
                k: HostKv {
                    data: kd,
                    shape: kshape,
                    strides: kstr,
                },
                v: HostKv {
                    data: vd,
                    shape: kshape,
                    strides: vstr,
                },
                page_table: table,
                max_num_pages: meta.max_num_pages,
                page_table_stride: meta.max_num_pages,
                cache_seqlens: &meta.cache_seqlens,
                layout,
                bmm1_scale: bmm1,
                bmm2_scale: bmm2,
                window_left: plan.window_left,
                sinks: plan.sinks.as_deref(),
            };
            let r = self.reference(&input, meta.mode);
            errors.attention.merge(r.errors);
            let dt = self.model_dtype;
            for (o, &x) in out.iter_mut().zip(&r.out) {
                *o = dt.from_f64(x);
            }
        }
        // Into the engine's output, at its strides (every row, as the owning path).
        let [so, sh, sd] = io.out.strides();
        let dst = io.out.host_mut()?;
        for t in 0..rows {
            for h in 0..hq {
                for x in 0..d {
                    dst[t * so + h * sh + x * sd] = out[(t * hq + h) * d + x];
                }
            }
        }
        Ok(errors)
    }

    fn read_kv(&self, plan: &LayerPlan) -> Result<KvSnapshot> {
        Ok(match &self.layers[plan.layer] {
            Store::Half(k, v) => KvSnapshot::Half {
                k: k.clone(),
                v: v.clone(),
            },
            Store::Fp8(k, v) => KvSnapshot::Fp8 {
                k: k.clone(),
                v: v.clone(),
            },
        })
    }

    fn kv_bases(&self, plan: &LayerPlan) -> Result<(crate::KvLocation, u64, u64)> {
        let (k, v) = match &self.layers[plan.layer] {
            Store::Half(k, v) => (k.as_ptr() as u64, v.as_ptr() as u64),
            Store::Fp8(k, v) => (k.as_ptr() as u64, v.as_ptr() as u64),
        };
        Ok((crate::KvLocation::Host, k, v))
    }

    fn read_kv_pages(
        &self,
        plan: &LayerPlan,
        page_elems: usize,
        pages: &[usize],
    ) -> Result<KvSnapshot> {
        Ok(match &self.layers[plan.layer] {
            Store::Half(k, v) => KvSnapshot::Half {
                k: copy_pages_out(k, page_elems, pages),
                v: copy_pages_out(v, page_elems, pages),
            },
            Store::Fp8(k, v) => KvSnapshot::Fp8 {
                k: copy_pages_out(k, page_elems, pages),
                v: copy_pages_out(v, page_elems, pages),
            },
        })
    }

    fn write_kv_pages(
        &mut self,
        plan: &LayerPlan,
        page_elems: usize,
        pages: &[usize],
        data: &KvSnapshot,
    ) -> Result<()> {
        match (&mut self.layers[plan.layer], data) {
            (Store::Half(k, v), KvSnapshot::Half { k: dk, v: dv }) => {
                copy_pages_in(k, dk, page_elems, pages);
                copy_pages_in(v, dv, page_elems, pages);
            }
            (Store::Fp8(k, v), KvSnapshot::Fp8 { k: dk, v: dv }) => {
                copy_pages_in(k, dk, page_elems, pages);
                copy_pages_in(v, dv, page_elems, pages);
            }
            _ => return Err(page_dtype_err()),
        }
        Ok(())
    }
}
