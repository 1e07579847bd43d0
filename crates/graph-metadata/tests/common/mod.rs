//! Shared test data of the graph-metadata tests (CPU and GPU): the spec's
//! worked data, one launch's inputs as a host `Case`, and the proptest
//! strategy over every mode.
#![allow(dead_code)]

use graph_metadata::reference::{
    page_map_from_slot_map, update_graph_metadata_with_page_map, HostInputs, HostOutputs,
};
use graph_metadata::{pad_ragged_verify_lens, prepare_replay, GraphMode};
use kernel_rt::ErrorReport;
use proptest::prelude::*;

/// What outputs are poisoned with before a launch.
pub const POISON: i32 = -0x5A5A_5A5A;

/// `req_to_token` of SEMANTICS.md §edge-cases (P = 4): row 0 all zeros (padding row),
/// row 1 = pages 3, 7, 2, 10; row 2 = pages 5, 9 (then zeros). Width 16.
pub fn spec_rows() -> Vec<Vec<i32>> {
    vec![
        vec![0; 16],
        vec![12, 13, 14, 15, 28, 29, 30, 31, 8, 9, 10, 11, 40, 41, 42, 43],
        [20, 21, 22, 23, 36, 37, 38, 39]
            .into_iter()
            .chain([0; 8])
            .collect(),
    ]
}

/// SWA map of SEMANTICS.md §edge-cases: full page 3→1, 2→2, 10→3, 5→4, 9→5, 7 evicted;
/// size 48, length 53, last element −1.
pub fn spec_map() -> Vec<i64> {
    let mut map = vec![0i64; 53];
    for (full, swa) in [(3, 1), (2, 2), (10, 3), (5, 4), (9, 5)] {
        for o in 0..4 {
            map[full * 4 + o] = (swa * 4 + o) as i64;
        }
    }
    map[52] = -1;
    map
}

/// One update's inputs and which outputs are bound (host side).
#[derive(Debug, Clone)]
pub struct Case {
    pub mode: GraphMode,
    pub p: usize,
    pub m: usize,
    /// `[R, stride]` flattened, `W` used of each row.
    pub r2t: Vec<i32>,
    pub rows: usize,
    pub width: usize,
    pub r2t_stride: usize,
    pub rpi: Vec<i64>,
    pub seq_lens: Vec<i64>,
    pub qlens: Option<Vec<i32>>,
    /// Row stride of both page tables (≥ M).
    pub pt_stride: usize,
    pub cu_q: bool,
    pub map: Option<Vec<i64>>,
    pub swa_table: bool,
    /// Full page → SWA page map: when set (with `map` and `swa_table`), the
    /// SWA page table takes the page-map path.
    pub page_map: Option<Vec<i32>>,
    /// `Some((out_cache_loc, n_swa))`: SWA write locations bound.
    pub write_locs: Option<(Option<Vec<i64>>, usize)>,
    pub pool_slots: Option<usize>,
}

impl Case {
    /// A decode-style case over `rows` (padded to a common width).
    pub fn new(
        mode: GraphMode,
        rows: &[Vec<i32>],
        rpi: &[i64],
        seq_lens: &[i64],
        p: usize,
        m: usize,
    ) -> Self {
        let w = rows.iter().map(Vec::len).max().unwrap_or(0);
        let r2t = rows
            .iter()
            .flat_map(|row| {
                row.iter()
                    .copied()
                    .chain(std::iter::repeat_n(0, w - row.len()))
            })
            .collect();
        Self {
            mode,
            p,
            m,
            r2t,
            rows: rows.len(),
            width: w,
            r2t_stride: w,
            rpi: rpi.to_vec(),
            seq_lens: seq_lens.to_vec(),
            qlens: None,
            pt_stride: m,
            cu_q: true,
            map: None,
            swa_table: false,
            page_map: None,
            write_locs: None,
            pool_slots: None,
        }
    }

    /// The same case with its slot map made page-granular (SEMANTICS.md §swa-pool.2,
    /// what the paired allocator maintains): `N_map − 1` rounded down to a
    /// multiple of `P`; full page `F` maps to SWA page `S = min(map[F·P] /
    /// P, i32::MAX)` when that entry is positive (`map[F·P + o] = S·P + o`), else is unmapped
    /// (all 0); last entry −1. The page-map path then equals the slot-map
    /// path. Page map cleared (slot-map path).
    ///
    /// # Panics
    /// Without a slot map (a test-setup bug).
    pub fn granular(&self) -> Self {
        let old = self.map.as_ref().expect("granular() needs a slot map");
        let p = self.p;
        let pages = (old.len() - 1) / p;
        let mut map = vec![0i64; pages * p + 1];
        for f in 0..pages {
            let e = old[f * p];
            if e > 0 {
                // SWA pages stay i32 (the table's type); entries past
                // i32::MAX slots still occur (the slot path's 64-bit case).
                let s = (e / p as i64).min(i64::from(i32::MAX));
                for o in 0..p {
                    map[f * p + o] = s * p as i64 + o as i64;
                }
            }
        }
        map[pages * p] = -1;
        let mut c = self.clone();
        c.map = Some(map);
        c.page_map = None;
        c
    }

    /// Binds the page map built from the case's (page-granular) slot map.
    ///
    /// # Panics
    /// When the slot map has no page-map equivalent or no SWA table is bound.
    pub fn with_page_map(mut self) -> Self {
        assert!(self.swa_table, "the page map fills the SWA page table");
        let map = self.map.as_ref().expect("slot map");
        self.page_map = Some(page_map_from_slot_map(map, self.p).expect("page-granular slot map"));
        self
    }

    /// Whether the SWA page table is built (slot map and table bound): the
    /// cases the page-map path applies to.
    pub fn has_swa_table(&self) -> bool {
        self.map.is_some() && self.swa_table
    }

    /// Binds the SWA map, the SWA table and (optionally) write locations.
    pub fn with_swa(
        mut self,
        map: Vec<i64>,
        write_locs: Option<(Option<Vec<i64>>, usize)>,
    ) -> Self {
        self.map = Some(map);
        self.swa_table = true;
        self.write_locs = write_locs;
        self
    }

    pub fn bs(&self) -> usize {
        self.seq_lens.len()
    }

    /// Poisoned output buffers (tables at row stride `pt_stride`).
    pub fn poisoned(&self) -> HostOutputs {
        let bs = self.bs();
        let mut o = HostOutputs::filled(
            bs,
            self.m,
            self.cu_q,
            self.map.is_some() && self.swa_table,
            self.write_locs.as_ref().map(|w| w.1),
            POISON,
        );
        o.page_table = vec![POISON; bs * self.pt_stride];
        o.page_table_stride = self.pt_stride;
        if let Some(t) = o.swa_page_table.as_mut() {
            *t = vec![POISON; bs * self.pt_stride];
        }
        o.swa_page_table_stride = self.pt_stride;
        o
    }

    pub fn inputs(&self) -> HostInputs<'_> {
        HostInputs {
            mode: self.mode,
            req_pool_indices: &self.rpi,
            seq_lens: &self.seq_lens,
            req_to_token: &self.r2t,
            req_to_token_rows: self.rows,
            req_to_token_width: self.width,
            req_to_token_stride: self.r2t_stride,
            page_size: self.p,
            pool_slots: self.pool_slots,
            swa_mapping: self.map.as_deref(),
            out_cache_loc: self.write_locs.as_ref().and_then(|w| w.0.as_deref()),
            qlens: self.qlens.as_deref(),
        }
    }

    /// The reference applied to poisoned buffers (page-map path when the
    /// case binds a page map).
    pub fn reference(&self) -> (HostOutputs, ErrorReport) {
        let mut out = self.poisoned();
        let err =
            update_graph_metadata_with_page_map(&self.inputs(), self.page_map.as_deref(), &mut out);
        (out, err)
    }
}

/// Every mode, edges included: step ids 0..4, q_len 1..5, ragged bounds 1..6.
pub fn mode() -> impl Strategy<Value = GraphMode> {
    prop_oneof![
        Just(GraphMode::Decode),
        (0u32..4).prop_map(|step| GraphMode::DraftDecode { step }),
        (1u32..=5).prop_map(|q_len| GraphMode::TargetVerify { q_len }),
        (1u32..=5).prop_map(|q_len| GraphMode::DraftExtendV2 { q_len }),
        (1u32..=6).prop_map(|max_q_len| GraphMode::RaggedVerify { max_q_len }),
    ]
}

/// The whole input space: bs 0..=12, P ∈ {1, 2, 4, 16, 64} and random, lengths
/// at the page and width edges (and negative / huge ones), padded strides,
/// SWA maps with unmapped slots and the −1 sentinel, write locations shorter
/// and longer than the output, a few bad request indices and bad slots.
pub fn case() -> impl Strategy<Value = Case> {
    let p = prop_oneof![
        Just(1usize),
        Just(2),
        Just(4),
        Just(16),
        Just(64),
        1usize..=70
    ];
    (
        mode(),
        p,
        1usize..=20,
        1usize..=5,
        0usize..=12,
        0usize..=3,
        0usize..=2,
    )
        .prop_flat_map(|(mode, p, m, rows, bs, pad, pt_pad)| {
            let width = p * m + (pad * 7) % (p + 1);
            let stride = width + pad;
            let pool_len = 48 * p + 17;
            let slot = prop_oneof![
                20 => 0i32..pool_len as i32,
                1 => Just(-1i32),
                1 => (pool_len as i32)..(pool_len as i32 + 40)
            ];
            let r2t = proptest::collection::vec(slot, rows * stride..=rows * stride);
            let pm = (p * m) as i64;
            let len = prop_oneof![
                4 => 0i64..=pm + p as i64,
                1 => Just(0i64),
                1 => Just(1i64),
                1 => Just(p as i64 - 1),
                1 => Just(p as i64),
                1 => Just(p as i64 + 1),
                1 => Just(pm),
                1 => Just(pm + 1),
                1 => Just(-1i64),
                1 => Just(-7i64),
                1 => Just(i64::from(i32::MAX) / 2),
                1 => Just(i64::from(i32::MAX)),
                1 => Just(i64::MAX),
                1 => Just(i64::MIN),
            ];
            let rpi =
                prop_oneof![12 => 0i64..rows as i64, 1 => Just(rows as i64), 1 => Just(-3i64)];
            let max_q = mode.q_stride() as i32;
            let qlen = prop_oneof![8 => 0i32..=max_q, 1 => Just(-1i32), 1 => Just(max_q + 1)];
            let map = proptest::collection::vec(
                prop_oneof![3 => 0i64..(pool_len as i64), 1 => Just(0i64), 1 => Just(-1i64)],
                pool_len..=pool_len,
            );
            let tokens = mode.num_tokens(bs);
            let n_swa = prop_oneof![Just(tokens), 0usize..=tokens + 3];
            let n_out = prop_oneof![
                Just(None),
                Just(Some(tokens)),
                (0usize..=tokens + 3).prop_map(Some)
            ];
            let loc = prop_oneof![
                12 => 0i64..(pool_len as i64),
                1 => Just(-1i64),
                1 => (pool_len as i64 - 1)..(pool_len as i64 + 30)
            ];
            let locs = proptest::collection::vec(loc, tokens + 3..=tokens + 3);
            (
                Just((mode, p, m, rows, width, stride, pt_pad, pool_len)),
                r2t,
                proptest::collection::vec((rpi, len, qlen), bs..=bs),
                map,
                (
                    any::<bool>(),
                    any::<bool>(),
                    any::<bool>(),
                    any::<bool>(),
                    any::<bool>(),
                ),
                (n_swa, n_out, locs),
            )
        })
        .prop_map(
            |(
                (mode, p, m, rows, width, stride, pt_pad, pool_len),
                r2t,
                rowdata,
                mut map,
                flags,
                (n_swa, n_out, locs),
            )| {
                let (swa, swa_table, write, cu_q, pool) = flags;
                *map.last_mut().expect("non-empty") = -1;
                let ragged = matches!(mode, GraphMode::RaggedVerify { .. });
                let swa_table = swa_table || !write;
                Case {
                    mode,
                    p,
                    m,
                    r2t,
                    rows,
                    width,
                    r2t_stride: stride,
                    rpi: rowdata.iter().map(|x| x.0).collect(),
                    seq_lens: rowdata.iter().map(|x| x.1).collect(),
                    qlens: ragged.then(|| rowdata.iter().map(|x| x.2).collect()),
                    pt_stride: m + pt_pad,
                    cu_q: cu_q || ragged,
                    map: swa.then_some(map),
                    swa_table,
                    page_map: None,
                    write_locs: (swa && write).then(|| (n_out.map(|n| locs[..n].to_vec()), n_swa)),
                    pool_slots: pool.then_some(pool_len - 9),
                }
            },
        )
}

/// A case and an arbitrary page map for it (bound only when the case builds
/// the SWA table): entries valid, 0, negative, huge; length from 1 to past
/// the pool's pages, so slots past it occur.
pub fn case_with_page_map() -> impl Strategy<Value = Case> {
    case().prop_flat_map(|c| {
        let pool_pages = c.map.as_ref().map_or(1, |m| m.len() / c.p + 1);
        let entry = prop_oneof![
            8 => 0i32..(pool_pages as i32 + 5),
            2 => Just(0i32),
            1 => Just(-1i32),
            1 => Just(-7i32),
            1 => Just(i32::MAX),
        ];
        let len = prop_oneof![Just(pool_pages), 1usize..=pool_pages + 3];
        (
            Just(c),
            len.prop_flat_map(move |n| proptest::collection::vec(entry.clone(), n..=n)),
        )
            .prop_map(|(mut c, pages)| {
                if c.has_swa_table() {
                    c.page_map = Some(pages);
                }
                c
            })
    })
}

// ---- named cases (issue 4 "Must pass", SEMANTICS.md §edge-cases), shared with tests/gpu.rs ----

/// P = 4 rows 1..=3 with pages, row 0 all zeros, row 7 (stale) non-zero.
pub fn padded_decode_rows() -> Vec<Vec<i32>> {
    let mut rows = vec![vec![0; 16]; 8];
    rows[1] = (40..56).collect();
    rows[2] = (60..76).collect();
    rows[3] = (80..96).collect();
    rows[7] = (200..216).collect();
    rows
}

/// Padded decode: 3 real rows in a bs-4 bucket whose previous replay left
/// request index 7 in row 3. Replay preparation resets row 3 to request 0
/// and seq_len 1 → cache [5,3,4,1], cu_k [0,5,8,12,13], row 3's page [0].
pub fn padded_decode_case() -> Case {
    let prev = prepare_replay(4, 4, &[1, 2, 3, 7], &[9, 9, 9, 9], &[0; 4]).unwrap();
    assert_eq!(
        prev.req_pool_indices[3], 7,
        "previous replay had row 3 = request 7"
    );
    let r = prepare_replay(4, 4, &[1, 2, 3], &[5, 3, 4], &[]).unwrap();
    assert_eq!(r.req_pool_indices, [1, 2, 3, 0]);
    assert_eq!(r.seq_lens, [5, 3, 4, 1]);
    Case::new(
        GraphMode::Decode,
        &padded_decode_rows(),
        &r.req_pool_indices,
        &r.seq_lens,
        4,
        4,
    )
}

/// Draft decode step 1, seq_lens [5,7], P 4 → cache [7,9], cu_k [0,7,16],
/// cu_q [0,1,2], 2 and 3 live pages; step 0 gives [6,8].
pub fn draft_decode_case(step: u32) -> Case {
    let rows = vec![
        vec![0; 16],
        (0..16).map(|t| 100 + t).collect(),
        (0..16).map(|t| 200 + t).collect(),
    ];
    Case::new(
        GraphMode::DraftDecode { step },
        &rows,
        &[1, 2],
        &[5, 7],
        4,
        6,
    )
}

/// Target verify: 4 draft tokens configured, graph captured for 6 tokens
/// over bs 2 → q_len 3 (D2), seq_lens [4,2] → cache [7,5], cu_q [0,3,6].
pub fn target_verify_case() -> Case {
    const CONFIGURED_DRAFT_TOKENS: u32 = 4;
    let mode = GraphMode::target_verify(6, 2).unwrap();
    assert_eq!(mode, GraphMode::TargetVerify { q_len: 3 });
    assert_ne!(mode.q_stride(), CONFIGURED_DRAFT_TOKENS);
    Case::new(mode, &spec_rows(), &[1, 2], &[4, 2], 4, 4)
}

/// SWA map for the write-location example: 12..15 → 20..23, 16..19 → 4..7,
/// 0 → 0; P 4, size 24, length 29, last −1.
pub fn write_loc_map() -> Vec<i64> {
    let mut map = vec![0i64; 29];
    for o in 0..4 {
        map[12 + o] = 20 + o as i64;
        map[16 + o] = 4 + o as i64;
    }
    map[28] = -1;
    map
}

/// Decode bucket of 4 rows, one token each, SWA write locations bound.
pub fn write_loc_case(real_locs: &[i64]) -> Case {
    let raw_bs = real_locs.len();
    let r = prepare_replay(4, 4, &vec![1; raw_bs], &vec![3; raw_bs], real_locs).unwrap();
    let rows = vec![vec![0; 8], (12..20).collect()];
    Case::new(
        GraphMode::Decode,
        &rows,
        &r.req_pool_indices,
        &r.seq_lens,
        4,
        2,
    )
    .with_swa(write_loc_map(), Some((Some(r.out_cache_loc), 4)))
}

/// Named-test case `spec_case_7` (see tests/reference.rs).
pub fn spec_case_7(rpi: &[i64]) -> Case {
    Case::new(GraphMode::Decode, &spec_rows(), rpi, &[10, 4, 1, 1], 4, 4)
        .with_swa(spec_map(), Some((Some(vec![9, 23, 0, 0]), 6)))
}

/// Named-test case `ragged_case` (see tests/reference.rs).
pub fn ragged_case() -> Case {
    let mut c = Case::new(
        GraphMode::RaggedVerify { max_q_len: 4 },
        &spec_rows(),
        &[1, 2, 1, 0, 0],
        &[10, 4, 6, 1, 1],
        4,
        4,
    );
    c.qlens = Some(pad_ragged_verify_lens(&[2, 1, 3], 8, 5).unwrap());
    c
}
