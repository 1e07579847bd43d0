//! Engine-owned memory for the engine-path tests: a strided `req_to_token`
//! mirror, SWA maps and per-layer K/V caches in NHD / HND order with
//! padded pages, plus random batches of every mode driven through an
//! owning backend (whose pools decide the slots), on the host; the GPU
//! tests upload the same buffers.
#![allow(dead_code)]

use mha_backend::{
    AttnMode, BackendConfig, ForwardBatch, ForwardMetadata, KvCacheDtype, KvLayout, MhaBackend,
    Pools,
};
use rand::rngs::StdRng;
use rand::Rng;

/// Geometry of one engine cache: `pages` pages of `P` slots, `Hkv`, `D`,
/// memory order and the padding after each page (elements).
#[derive(Debug, Clone, Copy)]
pub struct Geo {
    pub pages: usize,
    pub p: usize,
    pub hkv: usize,
    pub d: usize,
    pub layout: KvLayout,
    pub pad: usize,
}

impl Geo {
    /// Shape in memory order.
    pub fn mem_shape(&self) -> [usize; 4] {
        match self.layout {
            KvLayout::Nhd => [self.pages, self.p, self.hkv, self.d],
            KvLayout::Hnd => [self.pages, self.hkv, self.p, self.d],
        }
    }

    /// Element strides in memory order.
    pub fn mem_strides(&self) -> [usize; 4] {
        let page = self.p * self.hkv * self.d + self.pad;
        match self.layout {
            KvLayout::Nhd => [page, self.hkv * self.d, self.d, 1],
            KvLayout::Hnd => [page, self.p * self.d, self.d, 1],
        }
    }

    /// Elements of the buffer.
    pub fn len(&self) -> usize {
        self.pages * self.mem_strides()[0]
    }

    /// Offset of element `(slot, head, 0)`.
    pub fn offset(&self, slot: usize, h: usize) -> usize {
        let (_, st) = self
            .layout
            .to_kernel_order(self.mem_shape(), self.mem_strides());
        (slot / self.p) * st[0] + h * st[1] + (slot % self.p) * st[2]
    }

    /// The cache as `[slots, Hkv, D]` (the owning path's snapshot order).
    pub fn slot_major<T: Copy>(&self, buf: &[T]) -> Vec<T> {
        let mut out = Vec::with_capacity(self.pages * self.p * self.hkv * self.d);
        for s in 0..self.pages * self.p {
            for h in 0..self.hkv {
                let o = self.offset(s, h);
                out.extend_from_slice(&buf[o..o + self.d]);
            }
        }
        out
    }
}

/// One layer's engine caches.
#[derive(Debug, Clone)]
pub enum Caches {
    Half(Vec<u16>, Vec<u16>),
    Fp8(Vec<u8>, Vec<u8>),
}

/// The engine's memory, on the host.
#[derive(Debug, Clone)]
pub struct EngineMem {
    /// `[rows, width]` with row stride `stride > width`.
    pub r2t: Vec<i32>,
    pub rows: usize,
    pub width: usize,
    pub stride: usize,
    pub swa_map: Option<Vec<i64>>,
    pub page_map: Option<Vec<i32>>,
    pub layers: Vec<(Geo, Caches)>,
}

impl EngineMem {
    /// Zeroed caches sized like `pools`' (full or SWA per layer); layer `l`
    /// gets layout `layouts(l)` and `pad(l)` elements after each page.
    pub fn new(
        config: &BackendConfig,
        pools: &Pools,
        layouts: impl Fn(usize) -> (KvLayout, usize),
    ) -> Self {
        let p = config.page_size;
        let layers = config
            .layers
            .iter()
            .enumerate()
            .map(|(l, lc)| {
                let slots = if config.is_swa_layer(l) {
                    pools.swa_slots().unwrap_or(0)
                } else {
                    pools.full_slots()
                };
                let (layout, pad) = layouts(l);
                let geo = Geo {
                    pages: slots / p,
                    p,
                    hkv: lc.num_kv_heads,
                    d: lc.head_dim,
                    layout,
                    pad,
                };
                let n = geo.len();
                let c = match config.kv_dtype {
                    KvCacheDtype::Fp8E4m3 => Caches::Fp8(vec![0; n], vec![0; n]),
                    _ => Caches::Half(vec![0; n], vec![0; n]),
                };
                (geo, c)
            })
            .collect();
        let rows = pools.req_to_token_rows();
        let width = pools.req_to_token_width();
        let stride = width + 5;
        let mut m = Self {
            r2t: vec![0; (rows - 1) * stride + width],
            rows,
            width,
            stride,
            swa_map: None,
            page_map: None,
            layers,
        };
        m.mirror(pools);
        m
    }

    /// Copies the owning pools' `req_to_token` and SWA maps (what an engine
    /// that allocated the same slots would hold).
    pub fn mirror(&mut self, pools: &Pools) {
        let t = pools.req_to_token();
        for r in 0..self.rows {
            self.r2t[r * self.stride..r * self.stride + self.width]
                .copy_from_slice(&t[r * self.width..(r + 1) * self.width]);
        }
        self.swa_map = pools.swa_mapping().map(|m| m.map().to_vec());
        self.page_map = pools.swa_mapping().map(|m| m.page_map());
    }
}

/// The host inputs an engine batch views: the batch vectors, `cu_seqlens_q`
/// and the ragged lengths, as the engine would hold them.
#[derive(Debug, Clone)]
pub struct BatchVecs {
    pub mode: AttnMode,
    pub bs: usize,
    pub num_tokens: usize,
    pub max_q_len: usize,
    pub rpi: Vec<i64>,
    pub seq: Vec<i64>,
    pub loc: Vec<i64>,
    pub cu_q: Vec<i32>,
    pub verify_lens: Vec<i32>,
    pub decode_tail: usize,
}

impl BatchVecs {
    /// From a host batch and its (owning-path) metadata; `ragged_max_q` is
    /// the ragged-verify bound the owning CUDA path uses (`N`).
    pub fn of(b: &ForwardBatch, meta: &ForwardMetadata, ragged_max_q: usize) -> Self {
        let tail = meta
            .cu_seqlens_q
            .windows(2)
            .rev()
            .take_while(|w| w[1] - w[0] == 1)
            .count();
        Self {
            mode: meta.mode,
            bs: b.batch_size,
            num_tokens: meta.num_tokens,
            max_q_len: if meta.mode == AttnMode::RaggedVerify {
                meta.max_seq_len_q.max(ragged_max_q)
            } else {
                meta.max_seq_len_q
            },
            rpi: b.req_pool_indices.clone(),
            seq: b.seq_lens.clone(),
            loc: b.out_cache_loc.clone(),
            cu_q: meta.cu_seqlens_q.clone(),
            verify_lens: b.verify_lens().map(<[i32]>::to_vec).unwrap_or_default(),
            decode_tail: if meta.mode == AttnMode::Extend {
                tail
            } else {
                0
            },
        }
    }
}

/// Random batches of every mode over an owning backend (its pools pick the
/// slots): `mode` 0 extend (mixed), 1 decode, 2 uniform verify, 3 ragged
/// verify, 4 draft extend, 5 draft decode step 1.
pub struct Driver {
    pub live: Vec<usize>,
    pub draft_tokens: usize,
}

impl Driver {
    pub fn new(config: &BackendConfig) -> Self {
        Self {
            live: Vec::new(),
            draft_tokens: config.spec.map_or(1, |s| s.num_draft_tokens),
        }
    }

    fn room(&mut self, rng: &mut StdRng, b: &MhaBackend, ctx: usize) {
        let long: Vec<usize> = self
            .live
            .iter()
            .copied()
            .filter(|&r| b.with_pools(|p| p.request_len(r).unwrap_or(0)) + 24 > ctx)
            .collect();
        for r in long {
            b.free_request(r).unwrap();
            self.live.retain(|&x| x != r);
        }
        while !self.live.is_empty()
            && (b.with_pools(|p| {
                let f = p.free_pages();
                let f = if p.swa_mapping().is_some() {
                    f.min(p.free_swa_pages())
                } else {
                    f
                };
                f < 16 || p.free_request_rows() == 0
            }) || rng.gen_bool(0.05))
        {
            let i = rng.gen_range(0..self.live.len());
            b.free_request(self.live.swap_remove(i)).unwrap();
        }
    }

    /// A random batch of `mode` with its pool changes applied to `b`.
    pub fn batch(
        &mut self,
        rng: &mut StdRng,
        b: &MhaBackend,
        mode: u32,
        ctx: usize,
    ) -> ForwardBatch {
        self.room(rng, b, ctx);
        let len = |r: usize| b.with_pools(|p| p.request_len(r).unwrap_or(0));
        if mode == 0 {
            let bs = rng.gen_range(1..=3);
            let (mut rpi, mut pre, mut ext, mut grow) = (vec![], vec![], vec![], vec![]);
            for _ in 0..bs {
                let r = if !self.live.is_empty() && rng.gen_bool(0.5) {
                    self.live[rng.gen_range(0..self.live.len())]
                } else if b.with_pools(|p| p.free_request_rows()) > 0 {
                    let r = b.alloc_request().unwrap();
                    self.live.push(r);
                    r
                } else {
                    continue;
                };
                if rpi.contains(&(r as i64)) {
                    continue;
                }
                let e = if rng.gen_bool(0.4) {
                    1
                } else {
                    rng.gen_range(1..14)
                };
                pre.push(len(r) as i32);
                ext.push(e);
                grow.push((r, e as usize));
                rpi.push(r as i64);
            }
            let out = b.alloc_tokens(&grow).unwrap();
            return ForwardBatch::extend(rpi, pre, ext, out, true);
        }
        while self.live.len() < 2 {
            let r = b.alloc_request().unwrap();
            b.alloc_tokens(&[(r, rng.gen_range(1..40))]).unwrap();
            self.live.push(r);
        }
        let mut rows = self.live.clone();
        rows.truncate(rng.gen_range(1..=rows.len().min(4)));
        let n = self.draft_tokens;
        let q = rng.gen_range(1..=n);
        let lens: Vec<usize> = rows
            .iter()
            .map(|_| match mode {
                1 | 5 => 1,
                3 => rng.gen_range(1..=n),
                _ => q,
            })
            .collect();
        let old: Vec<i64> = rows.iter().map(|&r| len(r) as i64).collect();
        let grow: Vec<(usize, usize)> = rows.iter().copied().zip(lens.iter().copied()).collect();
        let out = b.alloc_tokens(&grow).unwrap();
        let rpi: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        match mode {
            1 => ForwardBatch::decode(rpi, old.iter().map(|l| l + 1).collect(), out),
            2 => ForwardBatch::target_verify(rpi, old, out, None),
            3 => ForwardBatch::target_verify(
                rpi,
                old,
                out,
                Some(lens.iter().map(|&l| l as i32).collect()),
            ),
            4 => ForwardBatch::draft_extend_v2(
                rpi,
                old.iter().map(|l| l + q as i64).collect(),
                out,
                q as i32,
            ),
            _ => ForwardBatch::draft_decode(rpi, old.iter().map(|l| l - 1).collect(), out, Some(1)),
        }
    }
}
