//! CPU tests of the page-table family: the reference's properties (proptest),
//! the issue's and spec's worked examples, the launch geometry, the params
//! layout and the PTX entry names. Run everywhere, CI included.

use kernel_rt::ErrorReport;
use page_table::reference::{build_page_table, HostInputs};
use page_table::{
    launch_config, ErrorFlags, PageTableParams, BLOCK_THREADS, KERNEL_NAMES, PAGES_PER_THREAD, PTX,
};
use proptest::prelude::*;

const POISON: i32 = -0x5A5A_5A5A;

/// Runs the reference on a poisoned `[bs, m]` table; returns (table, swa, errors).
fn run(
    r2t: &[Vec<i32>],
    rpi: &[i64],
    lens: &[i32],
    p: usize,
    m: usize,
    map: Option<&[i64]>,
) -> (Vec<i32>, Vec<i32>, ErrorReport) {
    let w = r2t.iter().map(Vec::len).max().unwrap_or(0);
    let flat: Vec<i32> = r2t
        .iter()
        .flat_map(|row| {
            row.iter()
                .copied()
                .chain(std::iter::repeat_n(0, w - row.len()))
        })
        .collect();
    let input = HostInputs {
        req_to_token: &flat,
        req_to_token_rows: r2t.len(),
        req_to_token_width: w,
        req_to_token_stride: w,
        req_pool_indices: rpi,
        cache_seqlens: lens,
        page_size: p,
        max_num_pages: m,
        full_to_swa: map,
        pool_slots: None,
    };
    let mut table = vec![POISON; rpi.len() * m];
    let mut swa = vec![POISON; rpi.len() * m];
    let err = build_page_table(
        &input,
        &mut table,
        m,
        map.is_some().then_some((&mut swa[..], m)),
    );
    (table, swa, err)
}

fn live(table: &[i32], m: usize, row: usize, n: usize) -> Vec<i32> {
    table[row * m..row * m + n].to_vec()
}

/// Issue 2: P = 4, row 2 = [40..43, 8..11, 100..103, 12..15, ...].
#[test]
fn issue_example_p4_row2() {
    let mut row2: Vec<i32> = [40, 8, 100, 12].iter().flat_map(|&s| s..s + 4).collect();
    row2.extend(16..32);
    let r2t = vec![vec![0; 32], vec![0; 32], row2];
    for (len, want) in [
        (10, vec![10, 2, 25]),
        (12, vec![10, 2, 25]),
        (13, vec![10, 2, 25, 3]),
    ] {
        let (t, _, err) = run(&r2t, &[2], &[len], 4, 8, None);
        assert_eq!(live(&t, 8, 0, want.len()), want, "seq_len {len}");
        assert!(
            t[want.len()..].iter().all(|&v| v == POISON),
            "tail untouched"
        );
        assert!(err.is_clean());
    }
}

/// Issue 2: P = 32, identity row req_to_token[1][t] = 32000 + t, seq_len 4097.
#[test]
fn issue_example_identity_row_4097() {
    let m = 130;
    let row1: Vec<i32> = (0..m as i32 * 32).map(|t| 32000 + t).collect();
    let r2t = vec![vec![0; row1.len()], row1];
    let (t, _, err) = run(&r2t, &[1], &[4097], 32, m, None);
    let want: Vec<i32> = (0..129).map(|p| 1000 + p).collect();
    assert_eq!(live(&t, m, 0, 129), want);
    assert_eq!(t[128], 1128);
    assert_eq!(t[129], POISON, "entry 129 is past the live prefix");
    assert!(err.is_clean());
}

/// Issue 2: bs 0 writes nothing.
#[test]
fn empty_batch_writes_nothing() {
    let (t, _, err) = run(&[vec![0; 8]], &[], &[], 4, 2, None);
    assert!(t.is_empty());
    assert!(err.is_clean());
}

fn spec_rows() -> Vec<Vec<i32>> {
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
fn spec_map() -> Vec<i64> {
    let mut map = vec![0i64; 53];
    for (full, swa) in [(3, 1), (2, 2), (10, 3), (5, 4), (9, 5)] {
        for o in 0..4 {
            map[full * 4 + o] = (swa * 4 + o) as i64;
        }
    }
    map[52] = -1;
    map
}

/// SEMANTICS.md §page-table.7 and edge cases 1, 5 (SEMANTICS.md §edge-cases).
#[test]
fn spec_worked_example_with_swa() {
    let map = spec_map();
    type Rows<'a> = [&'a [i32]; 2];
    let cases: [([i32; 2], Rows, Rows); 3] = [
        ([10, 4], [&[3, 7, 2], &[5]], [&[1, 0, 2], &[4]]),
        ([12, 6], [&[3, 7, 2], &[5, 9]], [&[1, 0, 2], &[4, 5]]),
        ([13, 7], [&[3, 7, 2, 10], &[5, 9]], [&[1, 0, 2, 3], &[4, 5]]),
    ];
    for (lens, full, swa) in cases {
        let (t, s, err) = run(&spec_rows(), &[1, 2], &lens, 4, 4, Some(&map));
        for row in 0..2 {
            assert_eq!(
                live(&t, 4, row, full[row].len()),
                full[row],
                "{lens:?} row {row}"
            );
            assert_eq!(
                live(&s, 4, row, swa[row].len()),
                swa[row],
                "{lens:?} swa row {row}"
            );
            assert!(t[row * 4 + full[row].len()..row * 4 + 4]
                .iter()
                .all(|&v| v == POISON));
        }
        assert!(err.is_clean());
    }
}

/// edge cases 2 (SEMANTICS.md §edge-cases) (P = 1 copies the slots) and 3 (P = 16 boundary).
#[test]
fn page_size_one_and_sixteen() {
    let (t, _, _) = run(&[vec![5, 9, 2, 7]], &[0], &[4], 1, 4, None);
    assert_eq!(t, vec![5, 9, 2, 7]);
    let row: Vec<i32> = (32..64).collect();
    let (t, _, _) = run(std::slice::from_ref(&row), &[0], &[16], 16, 2, None);
    assert_eq!(t, vec![2, POISON]);
    let (t, _, _) = run(&[row], &[0], &[17], 16, 2, None);
    assert_eq!(t, vec![2, 3]);
}

/// edge cases 4 (SEMANTICS.md §edge-cases) and 6: zero length untouched; a row longer than M clamps.
#[test]
fn zero_length_and_row_past_table_width() {
    let (t, _, err) = run(&spec_rows(), &[2], &[0], 4, 4, None);
    assert!(t.iter().all(|&v| v == POISON));
    assert!(err.is_clean());
    let row: Vec<i32> = (100..124).collect();
    let (t, _, err) = run(&[row], &[0], &[17], 4, 4, None);
    assert_eq!(t, vec![25, 26, 27, 28]);
    assert_eq!(
        err,
        ErrorReport {
            count: 1,
            flags: ErrorFlags::ROW_CLAMPED.bits()
        }
    );
}

/// DESIGN.md D9: negative slot → 0 (full) / −1 (SWA); out-of-map → SWA 0;
/// bad request index → row skipped; all counted.
#[test]
fn out_of_domain_device_data_is_counted() {
    let map = spec_map();
    let rows = vec![vec![-1, -1, -1, -1, 60, 61, 62, 63]];
    let (t, s, err) = run(&rows, &[0], &[8], 4, 2, Some(&map));
    assert_eq!(t, vec![0, 15]);
    assert_eq!(s, vec![-1, 0]);
    assert_eq!(
        err,
        ErrorReport {
            count: 2,
            flags: (ErrorFlags::NEGATIVE_SLOT.bits() | ErrorFlags::SLOT_OUTSIDE_MAP.bits())
        }
    );
    let (t, _, err) = run(&rows, &[3], &[8], 4, 2, None);
    assert!(t.iter().all(|&v| v == POISON));
    assert_eq!(err.flags, ErrorFlags::BAD_REQUEST_INDEX.bits());
    // Row shorter than the pages it would need: clamped to ceil(W / P).
    let (t, _, err) = run(&[vec![8, 9, 10, 11, 12]], &[0], &[12], 4, 4, None);
    assert_eq!(t, vec![2, 3, POISON, POISON]);
    assert_eq!(err.flags, ErrorFlags::ROW_PAST_WIDTH.bits());
}

#[test]
fn params_layout_matches_cuda() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<PageTableParams>(), 128);
    assert_eq!(offset_of!(PageTableParams, errors), 48);
    assert_eq!(offset_of!(PageTableParams, req_to_token_rows), 56);
    assert_eq!(offset_of!(PageTableParams, pool_slots), 104);
    assert_eq!(offset_of!(PageTableParams, bs), 112);
    assert_eq!(offset_of!(PageTableParams, page_size), 120);
    // The PTX declares one 128-byte parameter, as the struct above.
    assert!(PTX.ptx.contains("page_table_build_param_0[128]"));
}

#[test]
fn scatter_params_layout_matches_cuda() {
    use page_table::ScatterParams;
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<ScatterParams>(), 56);
    assert_eq!(offset_of!(ScatterParams, errors), 16);
    assert_eq!(offset_of!(ScatterParams, req_to_token_rows), 24);
    assert_eq!(offset_of!(ScatterParams, n), 48);
    assert!(PTX.ptx.contains("req_to_token_scatter_param_0[56]"));
}

#[test]
fn scatter_reference_writes_and_skips() {
    use page_table::reference::scatter;
    // [R=2, W=3] with row stride 4 (column 3 is padding, never written).
    let mut t = vec![-1; 8];
    let err = scatter(
        &mut t,
        2,
        3,
        4,
        &[
            [0, 10],
            [4, 14],
            [5, 15],
            [6, 99],
            [-1, 7],
            [2, 1 << 40],
            [1, -3],
        ],
    );
    assert_eq!(t, vec![10, -3, -1, -1, -1, 14, 15, -1]);
    // position 6 = R·W, −1 and a slot past i32: three skipped entries.
    assert_eq!(err.count, 3);
    assert_eq!(err.flags, ErrorFlags::BAD_ENTRY.bits());
    let mut empty: Vec<i32> = Vec::new();
    assert!(scatter(&mut empty, 0, 5, 5, &[[0, 1]]).count == 1);
}

#[test]
fn ptx_has_every_kernel_name() {
    for name in KERNEL_NAMES {
        assert!(PTX.has_entry(name), "{name} missing from the PTX");
    }
    assert!(!PTX.has_entry("page_table"), "prefix must not match");
}

#[test]
fn committed_ptx_is_fresh() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let kernel = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/page_table.cu");
    kernel_rt::ptxhash::check_fresh(&root, &kernel, PTX.ptx).unwrap();
}

/// The embedded sm_90 cubin was assembled from the embedded PTX by the pinned
/// ptxas (its stamp; no CUDA needed).
#[test]
fn committed_cubin_is_fresh() {
    kernel_rt::ptxhash::check_cubin(&PTX).unwrap();
}

/// A random batch: rows obey the page-contiguity invariant, with a small
/// chance of bad request indices and bad slots.
#[derive(Debug, Clone)]
struct Case {
    p: usize,
    m: usize,
    rows: Vec<Vec<i32>>,
    rpi: Vec<i64>,
    lens: Vec<i32>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![
            Just(1usize),
            Just(2),
            Just(16),
            Just(32),
            Just(64),
            Just(128),
            1usize..=130
        ],
        1usize..=12,
        1usize..=5,
        0usize..=9,
    )
        .prop_flat_map(|(p, m, r, bs)| {
            let w = p * m + 3;
            let rows =
                proptest::collection::vec(proptest::collection::vec(-2i32..5000, w..=w), r..=r);
            let len = prop_oneof![
                Just(0i32),
                Just(1),
                Just(p as i32 - 1),
                Just(p as i32),
                Just(p as i32 + 1),
                Just((p * m) as i32),
                Just((p * m) as i32 + 1),
                0i32..=(p * m + 2) as i32,
            ];
            let rpi = prop_oneof![8 => 0i64..r as i64, 1 => Just(r as i64), 1 => Just(-1i64)];
            (
                Just(p),
                Just(m),
                rows,
                proptest::collection::vec((rpi, len), bs..=bs),
            )
        })
        .prop_map(|(p, m, rows, pairs)| Case {
            p,
            m,
            rows,
            rpi: pairs.iter().map(|x| x.0).collect(),
            lens: pairs.iter().map(|x| x.1).collect(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every live entry is req_to_token[r, p·P] / P, the tail is untouched,
    /// and the error count matches the events in the input.
    #[test]
    fn live_prefix_is_sampled_slot_over_page_size(c in case()) {
        let (t, _, err) = run(&c.rows, &c.rpi, &c.lens, c.p, c.m, None);
        let mut events = 0;
        for (i, (&r, &len)) in c.rpi.iter().zip(&c.lens).enumerate() {
            if r < 0 || r as usize >= c.rows.len() {
                events += 1;
                prop_assert!(t[i * c.m..(i + 1) * c.m].iter().all(|&v| v == POISON));
                continue;
            }
            let want_n = (len as usize).div_ceil(c.p);
            let n = want_n.min(c.m);
            events += usize::from(want_n > c.m);
            for page in 0..c.m {
                let got = t[i * c.m + page];
                if page < n {
                    let slot = c.rows[r as usize][page * c.p];
                    if slot < 0 {
                        events += 1;
                        prop_assert_eq!(got, 0);
                    } else {
                        prop_assert_eq!(got, slot / c.p as i32);
                    }
                } else {
                    prop_assert_eq!(got, POISON);
                }
            }
        }
        prop_assert_eq!(err.count as usize, events);
    }

    /// Geometry covers every page of every row, within CUDA's limits.
    #[test]
    fn launch_config_covers_every_page(bs in 1usize..5000, m in 1usize..200_000) {
        let cfg = launch_config(bs, m).unwrap();
        prop_assert_eq!(cfg.grid_dim.0 as usize, bs);
        prop_assert!(cfg.grid_dim.1 >= 1 && cfg.grid_dim.1 <= 65_535);
        prop_assert_eq!(cfg.block_dim.0, BLOCK_THREADS);
        // Grid-stride over pages: covered as long as the stride is positive;
        // and no more chunks than pages need.
        let block = BLOCK_THREADS as usize * PAGES_PER_THREAD;
        prop_assert!((cfg.grid_dim.1 as usize - 1) * block < m);
    }
}

#[test]
fn committed_abi_header_is_current() {
    // The C params structs and flag bits the kernels include are generated
    // from the Rust definitions (`cargo xtask abi`); a stale header fails here.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    kernel_rt::abi::check_committed(dir, &page_table::ABI).unwrap();
}
