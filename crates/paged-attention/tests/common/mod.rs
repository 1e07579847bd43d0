//! Host-side test cases shared by the CPU tests and the GPU tests.
#![allow(dead_code, clippy::too_many_arguments, clippy::needless_range_loop)]

use paged_attention::reference::{attention, HostInputs, HostKv, HostLayout, KvData, RefOutput};
use paged_attention::{HalfDtype, KvDtype};

/// A whole attention call, host side. KV pools are slot-major (NHD)
/// `[num_pages·P, Hkv, D]`; the kernels see the `[pages, Hkv, P, D]` view.
#[derive(Debug, Clone)]
pub struct Case {
    pub q_dtype: HalfDtype,
    pub kv_dtype: KvDtype,
    pub d: usize,
    pub hq: usize,
    pub hkv: usize,
    pub p: usize,
    pub num_pages: usize,
    /// Bits (u16) or bytes (u8, e4m3, stored in the low byte).
    pub k: Vec<u16>,
    pub v: Vec<u16>,
    /// Head stride handed to the view (ignored when `hkv == 1`).
    pub head_stride: usize,
    pub page_table: Vec<i32>,
    pub m: usize,
    pub lens: Vec<i32>,
    /// `Some(n)` = uniform, `None` = ragged.
    pub uniform: Option<usize>,
    pub cu: Vec<i32>,
    pub max_q_len: usize,
    pub num_tokens: usize,
    pub q: Vec<u16>,
    pub bmm1: f32,
    pub bmm2: f32,
    pub window: Option<u32>,
    pub sinks: Option<Vec<f32>>,
}

impl Case {
    /// Zero Q/K/V, identity-free page table of zeros.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kv_dtype: KvDtype,
        d: usize,
        hq: usize,
        hkv: usize,
        p: usize,
        num_pages: usize,
        bs: usize,
        m: usize,
        uniform: Option<usize>,
        num_tokens: usize,
    ) -> Self {
        let pool = num_pages * p * hkv * d;
        Self {
            q_dtype: HalfDtype::Bf16,
            kv_dtype,
            d,
            hq,
            hkv,
            p,
            num_pages,
            k: vec![0; pool],
            v: vec![0; pool],
            head_stride: d,
            page_table: vec![0; bs * m],
            m,
            lens: vec![0; bs],
            uniform,
            cu: vec![0; bs + 1],
            max_q_len: uniform.unwrap_or(1),
            num_tokens,
            q: vec![0; num_tokens * hq * d],
            bmm1: 1.0,
            bmm2: 1.0,
            window: None,
            sinks: None,
        }
    }

    pub fn bs(&self) -> usize {
        self.lens.len()
    }

    pub fn q_len(&self) -> usize {
        self.uniform.unwrap_or(self.max_q_len)
    }

    pub fn encode_kv(&self, x: f64) -> u16 {
        match self.kv_dtype {
            KvDtype::Bf16 => HalfDtype::Bf16.from_f64(x),
            KvDtype::F16 => HalfDtype::F16.from_f64(x),
            KvDtype::E4m3 => u16::from(float8::F8E4M3::from_f64(x).to_bits()),
        }
    }

    pub fn kv_index(&self, slot: usize, head: usize, dim: usize) -> usize {
        (slot * self.hkv + head) * self.d + dim
    }

    pub fn set_k(&mut self, slot: usize, head: usize, dim: usize, x: f64) {
        let i = self.kv_index(slot, head, dim);
        self.k[i] = self.encode_kv(x);
    }

    pub fn set_v(&mut self, slot: usize, head: usize, dim: usize, x: f64) {
        let i = self.kv_index(slot, head, dim);
        self.v[i] = self.encode_kv(x);
    }

    pub fn set_q(&mut self, row: usize, head: usize, dim: usize, x: f64) {
        self.q[(row * self.hq + head) * self.d + dim] = self.q_dtype.from_f64(x);
    }

    /// Slot of position `k` of request `b`.
    pub fn slot(&self, b: usize, k: usize) -> usize {
        self.page_table[b * self.m + k / self.p] as usize * self.p + k % self.p
    }

    pub fn kv_strides(&self) -> [usize; 4] {
        [
            self.p * self.hkv * self.d,
            if self.hkv == 1 {
                self.head_stride
            } else {
                self.d
            },
            self.hkv * self.d,
            1,
        ]
    }

    pub fn k_bytes(&self) -> Vec<u8> {
        self.k.iter().map(|&x| x as u8).collect()
    }

    pub fn v_bytes(&self) -> Vec<u8> {
        self.v.iter().map(|&x| x as u8).collect()
    }

    pub fn reference(&self) -> RefOutput {
        let kb = self.k_bytes();
        let vb = self.v_bytes();
        let (kd, vd) = match self.kv_dtype {
            KvDtype::Bf16 => (KvData::Bf16(&self.k), KvData::Bf16(&self.v)),
            KvDtype::F16 => (KvData::F16(&self.k), KvData::F16(&self.v)),
            KvDtype::E4m3 => (KvData::E4m3(&kb), KvData::E4m3(&vb)),
        };
        let shape = [self.num_pages, self.hkv, self.p, self.d];
        let input = HostInputs {
            q: &self.q,
            q_dtype: self.q_dtype,
            q_shape: [self.num_tokens, self.hq, self.d],
            q_strides: [self.hq * self.d, self.d, 1],
            k: HostKv {
                data: kd,
                shape,
                strides: self.kv_strides(),
            },
            v: HostKv {
                data: vd,
                shape,
                strides: self.kv_strides(),
            },
            page_table: &self.page_table,
            max_num_pages: self.m,
            page_table_stride: self.m,
            cache_seqlens: &self.lens,
            layout: match self.uniform {
                Some(n) => HostLayout::Uniform { q_len_per_req: n },
                None => HostLayout::Ragged {
                    cu_seqlens_q: &self.cu,
                    max_q_len: self.max_q_len,
                },
            },
            bmm1_scale: self.bmm1,
            bmm2_scale: self.bmm2,
            window_left: self.window,
            sinks: self.sinks.as_deref(),
        };
        attention(&input)
    }

    /// Output element `[row, head, dim]` of a reference result.
    pub fn at(&self, out: &[f64], row: usize, head: usize, dim: usize) -> f64 {
        out[(row * self.hq + head) * self.d + dim]
    }
}

/// One query head, K zeros (uniform weights), `V[pos] = f(pos)` in dim 0 of
/// each request, contiguous private pages per request (page ids from 1).
pub fn uniform_weights_case(
    kv: KvDtype,
    d: usize,
    group: usize,
    p: usize,
    lens: &[i32],
    uniform: Option<usize>,
    num_tokens: usize,
    value: impl Fn(usize, usize) -> f64,
) -> Case {
    let bs = lens.len();
    let max_len = lens.iter().copied().max().unwrap_or(0).max(1) as usize;
    let m = max_len.div_ceil(p);
    let num_pages = 1 + bs * m;
    let mut c = Case::new(kv, d, group, 1, p, num_pages, bs, m, uniform, num_tokens);
    c.lens = lens.to_vec();
    for b in 0..bs {
        for e in 0..m {
            c.page_table[b * m + e] = (1 + b * m + e) as i32;
        }
        for pos in 0..lens[b].max(0) as usize {
            let s = c.slot(b, pos);
            c.set_v(s, 0, 0, value(b, pos));
        }
    }
    for row in 0..num_tokens {
        for h in 0..group {
            c.set_q(row, h, 0, 1.0);
        }
    }
    c
}

/// attention.md §11 data: Hkv 1, Hq 2, D `d` (≥ 2; dims past 2 are zero),
/// P 2, L 5, bmm1 1/√2, pages 0,1,2 in order.
pub fn worked_example(
    d: usize,
    n: usize,
    window: Option<u32>,
    sinks: Option<Vec<f32>>,
    bmm2: f32,
) -> Case {
    let mut c = Case::new(KvDtype::Bf16, d, 2, 1, 2, 3, 1, 3, Some(n), n);
    c.page_table = vec![0, 1, 2];
    c.lens = vec![5];
    let k = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.5], [0.5, -1.0]];
    let v = [[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 2.0], [1.0, 1.0]];
    for pos in 0..5 {
        for dd in 0..2 {
            c.set_k(pos, 0, dd, k[pos][dd]);
            c.set_v(pos, 0, dd, v[pos][dd]);
        }
    }
    // Query rows by position: 3 → head0 [1,2], head1 [0,-1]; 4 → head0 [2,0], head1 [1,1].
    let q3 = [[1.0, 2.0], [0.0, -1.0]];
    let q4 = [[2.0, 0.0], [1.0, 1.0]];
    let rows: Vec<[[f64; 2]; 2]> = if n == 1 { vec![q4] } else { vec![q3, q4] };
    for (r, qs) in rows.iter().enumerate() {
        for h in 0..2 {
            for dd in 0..2 {
                c.set_q(r, h, dd, qs[h][dd]);
            }
        }
    }
    c.bmm1 = std::f32::consts::FRAC_1_SQRT_2;
    c.bmm2 = bmm2;
    c.window = window;
    c.sinks = sinks;
    c
}

/// The GQA example: Hkv 1, Hq 2, P 2, head stride 2, page row [2, 0],
/// L 3, K slots 4,5,0 = [1,0],[0,1],[1,1]; V = [1,0],[0,1],[2,2]; q = [1,0],[0,1].
pub fn gqa_stride_example(d: usize) -> Case {
    let mut c = Case::new(KvDtype::Bf16, d, 2, 1, 2, 3, 1, 2, Some(1), 1);
    c.head_stride = 2;
    c.page_table = vec![2, 0];
    c.lens = vec![3];
    for (slot, kk, vv) in [
        (4, [1.0, 0.0], [1.0, 0.0]),
        (5, [0.0, 1.0], [0.0, 1.0]),
        (0, [1.0, 1.0], [2.0, 2.0]),
    ] {
        for dd in 0..2 {
            c.set_k(slot, 0, dd, kk[dd]);
            c.set_v(slot, 0, dd, vv[dd]);
        }
    }
    c.set_q(0, 0, 0, 1.0);
    c.set_q(0, 1, 1, 1.0);
    c
}

/// The FP8 sink example: k_scale 2 folded into bmm1 = 2, v_scale 1.
pub fn fp8_sink_example(d: usize) -> Case {
    let mut c = uniform_weights_case(KvDtype::E4m3, d, 1, 16, &[2], Some(1), 1, |_, _| 0.0);
    let (s0, s1) = (c.slot(0, 0), c.slot(0, 1));
    c.set_k(s0, 0, 0, 0.5);
    c.set_k(s1, 0, 0, 0.5);
    c.set_v(s0, 0, 0, 2.0);
    c.set_v(s1, 0, 0, 4.0);
    c.bmm1 = 2.0;
    c.sinks = Some(vec![1.0]);
    c
}

/// Uniform verify example: bs 2, prefixes [4, 2], q_len n, group g;
/// V = position (request 0) and 10 + position (request 1).
pub fn verify_uniform_example(d: usize, n: usize, g: usize) -> Case {
    let lens = [4 + n as i32, 2 + n as i32];
    uniform_weights_case(KvDtype::Bf16, d, g, 4, &lens, Some(n), 2 * n, |b, pos| {
        10.0 * b as f64 + pos as f64
    })
}

/// Ragged verify example: bucket 4, lengths [2,2,0,0], cache [5,7,1,1].
pub fn verify_ragged_example(d: usize) -> Case {
    let mut c = uniform_weights_case(KvDtype::Bf16, d, 1, 4, &[5, 7, 1, 1], None, 4, |b, pos| {
        10.0 * b as f64 + pos as f64
    });
    c.cu = vec![0, 2, 4, 4, 4];
    c.max_q_len = 2;
    c
}

/// Relative L2 error of one output row against the reference.
pub fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f64>()
        .sqrt();
    let den: f64 = want.iter().map(|b| b * b).sum::<f64>().sqrt();
    if den == 0.0 {
        num
    } else {
        num / den
    }
}
