//! CPU tests of the swa-pool family: the host map (allocation, freeing,
//! eviction, layers mapping), the reference's properties (proptest), the
//! issue's and spec's worked examples, launch geometry, params layouts and
//! PTX entry names. Run everywhere, CI included.

use kernel_rt::ErrorReport;
use proptest::prelude::*;
use swa_pool::reference::{
    translate_locs, translate_one, translate_pages, update_pages, PageInputs,
};
use swa_pool::{
    loc_launch_config, page_launch_config, ErrorFlags, EvictionPolicy, LayersMapping, SwaError,
    SwaLocParams, SwaMapping, SwaPageParams, SwaUpdateParams, BLOCK_THREADS, KERNEL_NAMES,
    LOC_UNROLL, MAX_LOC_BLOCKS, PTX,
};

const POISON: i32 = -0x5A5A_5A5A;

fn locs(map: &[i64], input: &[i64]) -> (Vec<i64>, ErrorReport) {
    let mut out = vec![i64::MIN; input.len()];
    let err = translate_locs(map, input, &mut out);
    (out, err)
}

/// Issue 3 map: full size 24, P = 4 (length 29), slots 12..15 → 20..23,
/// built through `SwaMapping` (SWA pages 1..4 taken first, then 3 → 5).
fn issue_mapping() -> SwaMapping {
    let mut m = SwaMapping::new(24, 20, 4).unwrap();
    assert_eq!(m.alloc_pages(&[1, 2, 4, 5]).unwrap(), vec![1, 2, 3, 4]);
    assert_eq!(m.alloc_pages(&[3]).unwrap(), vec![5]);
    assert_eq!(m.free_slots(&[4, 8, 16, 20]).unwrap(), 4);
    m
}

/// Issue 3, "Must pass": `[−1, 0, 13]` → `[−1, 0, 21]`.
#[test]
fn issue_example_translate_sentinel_zero_and_mapped() {
    let m = issue_mapping();
    let map = m.map();
    assert_eq!(map.len(), 29);
    assert_eq!(&map[12..16], &[20, 21, 22, 23]);
    assert_eq!(map[0], 0);
    assert_eq!(map[28], -1);
    assert!(map[..28]
        .iter()
        .enumerate()
        .all(|(i, &v)| (12..16).contains(&i) || v == 0));
    let (out, err) = locs(map, &[-1, 0, 13]);
    assert_eq!(out, vec![-1, 0, 21]);
    assert!(err.is_clean());
}

/// −1 stays −1 at every page size, P = 1 included.
#[test]
fn sentinel_survives_every_page_size() {
    for p in [1usize, 2, 3, 16, 64, 128] {
        let mut m = SwaMapping::new(8 * p, 4 * p, p).unwrap();
        m.alloc_slots(&[p as i64]).unwrap();
        let (out, err) = locs(m.map(), &[-1, -1]);
        assert_eq!(out, vec![-1, -1], "P = {p}");
        assert!(err.is_clean());
    }
}

/// SWA map of SEMANTICS.md §edge-cases: full page 3→1, 2→2, 10→3, 5→4, 9→5, 7 evicted;
/// size 48, length 53, built through `SwaMapping`.
fn spec_mapping() -> SwaMapping {
    let mut m = SwaMapping::new(48, 24, 4).unwrap();
    // Page 7 was allocated (taking SWA page 1) and later evicted; the other
    // pages then take SWA pages 2..6 (the spec numbers them 1..5).
    m.alloc_pages(&[7]).unwrap();
    m.free_slots(&[28]).unwrap();
    assert_eq!(
        m.alloc_pages(&[3, 2, 10, 5, 9]).unwrap(),
        vec![2, 3, 4, 5, 6]
    );
    m
}

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

/// SEMANTICS.md §swa-pool.6: `translate([9, 23, 29, −1])` = `[9, 19, 0, −1]`, page ids 1 and 0.
#[test]
fn spec_worked_example() {
    let map = spec_map();
    let (out, err) = locs(&map, &[9, 23, 29, -1]);
    assert_eq!(out, vec![9, 19, 0, -1]);
    assert!(err.is_clean());
    assert_eq!(map[12] / 4, 1);
    assert_eq!(map[28] / 4, 0);
    // The host map builds the same structure (other SWA page numbers).
    let m = spec_mapping();
    assert_eq!(m.swa_page_of(7), None);
    for page in [3, 2, 10, 5, 9] {
        let s = m.swa_page_of(page).unwrap() as i64;
        assert!((0..4).all(|o| m.map()[page * 4 + o] == s * 4 + o as i64));
    }
}

fn spec_rows() -> Vec<i32> {
    let mut r = vec![0; 16];
    r.extend([12, 13, 14, 15, 28, 29, 30, 31, 8, 9, 10, 11, 40, 41, 42, 43]);
    r.extend([20, 21, 22, 23, 36, 37, 38, 39]);
    r.extend([0; 8]);
    r
}

#[allow(clippy::too_many_arguments)] // mirrors PageInputs field by field
fn pages(
    r2t: &[i32],
    rows: usize,
    width: usize,
    rpi: &[i64],
    lens: &[i32],
    p: usize,
    m: usize,
    map: &[i64],
) -> (Vec<i32>, ErrorReport) {
    let input = PageInputs {
        req_to_token: r2t,
        req_to_token_rows: rows,
        req_to_token_width: width,
        req_to_token_stride: width,
        req_pool_indices: rpi,
        cache_seqlens: lens,
        page_size: p,
        max_num_pages: m,
        full_to_swa: map,
    };
    let mut table = vec![POISON; rpi.len() * m];
    let err = translate_pages(&input, &mut table, m);
    (table, err)
}

/// edge cases 5 (SEMANTICS.md §edge-cases): `rpi = [1, 2]`, `cache_seqlens = [10, 4]` → SWA `[1,0,2]`, `[4]`;
/// plus the other rows of SEMANTICS.md §page-table.7.
#[test]
fn edge_case_5_swa_page_table_with_evicted_page() {
    let map = spec_map();
    let cases: [([i32; 2], [&[i32]; 2]); 3] = [
        ([10, 4], [&[1, 0, 2], &[4]]),
        ([12, 6], [&[1, 0, 2], &[4, 5]]),
        ([13, 7], [&[1, 0, 2, 3], &[4, 5]]),
    ];
    for (lens, want) in cases {
        let (t, err) = pages(&spec_rows(), 3, 16, &[1, 2], &lens, 4, 4, &map);
        for row in 0..2 {
            assert_eq!(
                &t[row * 4..row * 4 + want[row].len()],
                want[row],
                "{lens:?} row {row}"
            );
            assert!(t[row * 4 + want[row].len()..row * 4 + 4]
                .iter()
                .all(|&v| v == POISON));
        }
        assert!(err.is_clean());
    }
}

/// Gathered by the token slot, then divided: a map whose pages are not
/// offset-aligned to page ids still gives map[slot] / P (never map[page]).
#[test]
fn page_translation_gathers_by_token_slot() {
    let mut map = vec![0i64; 4 * 8 + 4 + 1];
    *map.last_mut().unwrap() = -1;
    map[12] = 22; // full slot 12 (page 3) → SWA slot 22 → page 5
    map[3] = 99; // map[page id 3] must never be used
    let row: Vec<i32> = (12..16).collect();
    let (t, err) = pages(&row, 1, 4, &[0], &[4], 4, 1, &map);
    assert_eq!(t, vec![5]);
    assert!(err.is_clean());
}

/// edge cases 12 (SEMANTICS.md §edge-cases): `[−1, 23, 29]` → eager `[−1, 19, 0]`; into a length-5
/// buffer → `[−1, 19, 0, 0, 0]` (zero tail).
#[test]
fn edge_case_12_sentinel_and_short_input() {
    let map = spec_map();
    let (out, err) = locs(&map, &[-1, 23, 29]);
    assert_eq!(out, vec![-1, 19, 0]);
    assert!(err.is_clean());
    let mut buf = vec![i64::MIN; 5];
    let err = translate_locs(&map, &[-1, 23, 29], &mut buf);
    assert_eq!(buf, vec![-1, 19, 0, 0, 0]);
    assert!(err.is_clean());
}

/// A location outside the map is counted and written 0; −1 is not counted.
#[test]
fn locations_outside_the_map_are_counted_and_zero() {
    let map = spec_map();
    let (out, err) = locs(&map, &[-2, 52, 53, i64::MAX, i64::MIN, -1, 51]);
    assert_eq!(out, vec![0, 0, 0, 0, 0, -1, 0]);
    assert_eq!(
        err,
        ErrorReport {
            count: 5,
            flags: ErrorFlags::BELOW_SENTINEL.bits() | ErrorFlags::OUTSIDE_MAP.bits()
        }
    );
    let mut e = ErrorReport::default();
    assert_eq!(
        translate_one(&[-1], 0, &mut e),
        0,
        "a sentinel-only map has no slot"
    );
    assert_eq!(e.flags, ErrorFlags::OUTSIDE_MAP.bits());
}

/// D9 for the SWA table: negative slot → −1, out-of-map slot → 0, bad row skipped.
#[test]
fn page_table_out_of_domain_is_counted() {
    let map = spec_map();
    let row = vec![-1, -1, -1, -1, 60, 61, 62, 63];
    let (t, err) = pages(&row, 1, 8, &[0], &[8], 4, 2, &map);
    assert_eq!(t, vec![-1, 0]);
    assert_eq!(err.count, 2);
    assert_eq!(
        err.flags,
        ErrorFlags::NEGATIVE_SLOT.bits() | ErrorFlags::OUTSIDE_MAP.bits()
    );
    let (t, err) = pages(&row, 1, 8, &[1], &[8], 4, 2, &map);
    assert!(t.iter().all(|&v| v == POISON));
    assert_eq!(err.flags, ErrorFlags::BAD_REQUEST_INDEX.bits());
    let (_, err) = pages(&row, 1, 8, &[0], &[-3], 4, 2, &map);
    assert_eq!(err.flags, ErrorFlags::NEGATIVE_SEQLEN.bits());
    let (t, err) = pages(
        &(100..124).collect::<Vec<_>>(),
        1,
        24,
        &[0],
        &[17],
        4,
        4,
        &{
            let mut m = vec![0i64; 129];
            m[128] = -1;
            (100..124).for_each(|s| m[s] = s as i64 + 4);
            m
        },
    );
    assert_eq!(t, vec![26, 27, 28, 29]);
    assert_eq!(
        err,
        ErrorReport {
            count: 1,
            flags: ErrorFlags::ROW_CLAMPED.bits()
        }
    );
}

#[test]
fn exhaustion_is_an_error_never_an_overwrite() {
    let mut m = SwaMapping::new(32, 8, 4).unwrap(); // SWA pages 1, 2
    m.alloc_slots(&[4, 5, 6]).unwrap();
    let before = m.map().to_vec();
    match m.alloc_slots(&[8, 12]) {
        Err(SwaError::Exhausted { needed: 2, free: 1 }) => {}
        other => panic!("expected exhaustion, got {other:?}"),
    }
    assert_eq!(m.map(), &before[..], "nothing changed");
    assert_eq!(m.free_swa_pages(), 1);
    // Extending the partly used page needs no new page.
    assert_eq!(m.alloc_slots(&[7]).unwrap(), vec![7]);
    assert!(matches!(
        m.alloc_pages(&[1]),
        Err(SwaError::AlreadyMapped {
            page: 1,
            swa_page: 1
        })
    ));
    assert!(matches!(
        m.alloc_pages(&[2, 2]),
        Err(SwaError::AlreadyMapped { page: 2, .. })
    ));
    assert!(matches!(
        m.alloc_slots(&[2]),
        Err(SwaError::PageOutOfRange { page: 0, .. })
    ));
    assert!(matches!(
        m.alloc_slots(&[36]),
        Err(SwaError::SlotOutOfRange { slot: 36, .. })
    ));
    assert!(matches!(
        m.free_slots(&[-1]),
        Err(SwaError::SlotOutOfRange { slot: -1, .. })
    ));
    assert!(matches!(
        SwaMapping::new(30, 8, 4),
        Err(SwaError::Config(_))
    ));
    assert!(matches!(
        SwaMapping::new(32, 8, 0),
        Err(SwaError::Config(_))
    ));
    assert_eq!(m.map()[36], -1, "sentinel intact");
}

#[test]
fn free_widens_to_whole_pages_and_clear_resets() {
    let mut m = SwaMapping::new(32, 16, 4).unwrap();
    let s = m.alloc_slots(&[8, 9, 10, 20]).unwrap();
    assert_eq!(s, vec![4, 5, 6, 8]);
    assert_eq!(&m.map()[8..12], &[4, 5, 6, 7], "whole page mapped");
    assert_eq!(m.free_slots(&[10]).unwrap(), 1);
    assert!(m.map()[8..12].iter().all(|&v| v == 0));
    assert_eq!(m.free_slots(&[10, 11]).unwrap(), 0, "already free");
    m.clear();
    assert!(m.map()[..36].iter().all(|&v| v == 0));
    assert_eq!(m.map()[36], -1);
    assert_eq!(m.free_swa_pages(), 4);
}

#[test]
fn tail_only_allocation_maps_the_last_k() {
    let mut m = SwaMapping::new(32, 16, 4).unwrap();
    let slots: Vec<i64> = (4..14).collect(); // pages 1, 2, 3 (partly)
    let s = m.alloc_tail(&slots, 3).unwrap(); // positions 11, 12, 13: pages 2, 3
    assert_eq!(m.swa_page_of(1), None);
    assert!(s[..4].iter().all(|&v| v == 0));
    assert_eq!(&s[7..], &[m.map()[11], m.map()[12], m.map()[13]]);
    assert!(s[7..].iter().all(|&v| v > 0));
    // P = 1: exactly the last k.
    let mut m = SwaMapping::new(16, 8, 1).unwrap();
    let s = m.alloc_tail(&[3, 4, 5, 6], 2).unwrap();
    assert_eq!(s, vec![0, 0, 1, 2]);
}

#[test]
fn eviction_frees_whole_out_of_window_pages() {
    let p = 4;
    let mut m = SwaMapping::new(64, 64, p).unwrap();
    let row: Vec<i32> = (4..36).collect(); // positions 0..32, full pages 1..8
    m.alloc_slots(&row.iter().map(|&s| i64::from(s)).collect::<Vec<_>>())
        .unwrap();
    // pre_len 30, window 7: threshold 23 → floored to 20: positions [0, 20) freed.
    let e = m
        .evict_out_of_window(&row, 30, 7, 0, EvictionPolicy::ChunkCache)
        .unwrap();
    assert_eq!(e, 20);
    for (pos, &slot) in row.iter().enumerate() {
        let mapped = m.map()[slot as usize] != 0;
        assert_eq!(mapped, pos >= 20, "position {pos}");
    }
    // Radix: threshold = 30 − max(7, 4) = 23 → 20; nothing new.
    assert_eq!(
        m.evict_out_of_window(
            &row,
            30,
            7,
            e,
            EvictionPolicy::RadixCache { retain_floor: None }
        )
        .unwrap(),
        20
    );
    // retain floor lowers the threshold: nothing below the old evicted either.
    assert_eq!(
        m.evict_out_of_window(
            &row,
            32,
            2,
            e,
            EvictionPolicy::RadixCache {
                retain_floor: Some(8)
            }
        )
        .unwrap(),
        20
    );
    assert!(matches!(
        m.evict_out_of_window(&row, 40, 2, e, EvictionPolicy::ChunkCache),
        Err(SwaError::RowTooShort {
            len: 32,
            pre_len: 40
        })
    ));
    // Evicted positions translate to SWA page 0; the future query window never sees them.
    let map = m.map().to_vec();
    let (t, _) = pages(&row, 1, 32, &[0], &[30], p, 8, &map);
    assert_eq!(&t[..5], &[0; 5]);
    assert!(t[5..8].iter().all(|&v| v > 0));
}

#[test]
fn layers_mapping_routes_both_subpools() {
    let l = LayersMapping::new(&[0, 3, 7], &[1, 2, 4, 5, 6]).unwrap();
    assert_eq!(l.get(0).unwrap(), (0, false));
    assert_eq!(l.get(7).unwrap(), (2, false));
    assert_eq!(l.get(1).unwrap(), (0, true));
    assert_eq!(l.get(6).unwrap(), (4, true));
    assert!(matches!(l.get(8), Err(SwaError::UnknownLayer(8))));
    assert_eq!((l.num_full_layers(), l.num_swa_layers()), (3, 5));
    assert!(l.has_swa_layers());
    assert!(matches!(
        LayersMapping::new(&[0, 1], &[1]),
        Err(SwaError::DuplicateLayer(1))
    ));
    assert!(!LayersMapping::new(&[0, 1], &[]).unwrap().has_swa_layers());
}

#[test]
fn params_layout_matches_cuda() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<SwaLocParams>(), 56);
    assert_eq!(offset_of!(SwaLocParams, errors), 24);
    assert_eq!(offset_of!(SwaLocParams, n), 32);
    assert_eq!(offset_of!(SwaLocParams, full_to_swa_len), 48);
    assert_eq!(size_of::<SwaPageParams>(), 104);
    assert_eq!(offset_of!(SwaPageParams, errors), 40);
    assert_eq!(offset_of!(SwaPageParams, req_to_token_rows), 48);
    assert_eq!(offset_of!(SwaPageParams, full_to_swa_len), 80);
    assert_eq!(offset_of!(SwaPageParams, bs), 88);
    assert_eq!(offset_of!(SwaPageParams, page_size), 96);
    assert!(PTX.ptx.contains("swa_pool_translate_loc_param_0[56]"));
    assert!(PTX.ptx.contains("swa_pool_translate_pages_param_0[104]"));
    assert_eq!(size_of::<SwaUpdateParams>(), 64);
    assert_eq!(offset_of!(SwaUpdateParams, errors), 24);
    assert_eq!(offset_of!(SwaUpdateParams, n), 32);
    assert_eq!(offset_of!(SwaUpdateParams, page_size), 56);
    assert!(PTX.ptx.contains("swa_pool_update_pages_param_0[64]"));
}

/// Out-of-range update entries are skipped and counted once each; the
/// sentinel and other pages stay untouched.
#[test]
fn bad_update_entries_are_counted_never_written() {
    let mut m = SwaMapping::new(8, 8, 4).unwrap();
    m.alloc_pages(&[1, 2]).unwrap();
    let mut map = m.map().to_vec();
    let mut pm = m.page_map();
    let before = (map.clone(), pm.clone());
    // Page 3 is past the 3 full pages; SWA page 3 is past the 3 SWA pages; -1.
    let err = update_pages(&mut map, Some(&mut pm), 4, 3, &[3, 1, 1, 3, -1, 0, 2, -2]);
    assert_eq!(err.count, 4);
    assert_eq!(err.flags, ErrorFlags::BAD_UPDATE.bits());
    assert_eq!((map.clone(), pm.clone()), before);
    // A valid entry: page 2 → SWA page 0 (unmapped) zeroes its slots.
    let err = update_pages(&mut map, Some(&mut pm), 4, 3, &[2, 0]);
    assert!(err.is_clean());
    assert_eq!(&map[8..12], &[0, 0, 0, 0]);
    assert_eq!(pm[2], 0);
    assert_eq!(*map.last().unwrap(), -1);
}

#[test]
fn ptx_has_every_kernel_name() {
    for name in KERNEL_NAMES {
        assert!(PTX.has_entry(name), "{name} missing from the PTX");
    }
    assert!(
        !PTX.has_entry("swa_pool_translate"),
        "prefix must not match"
    );
}

#[test]
fn committed_ptx_is_fresh() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let kernel = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/swa_pool.cu");
    kernel_rt::ptxhash::check_fresh(&root, &kernel, PTX.ptx).unwrap();
}

/// The embedded sm_90 cubin was assembled from the embedded PTX by the pinned
/// ptxas (its stamp; no CUDA needed).
#[test]
fn committed_cubin_is_fresh() {
    kernel_rt::ptxhash::check_cubin(&PTX).unwrap();
}

/// One host-map operation of the state-machine proptest.
#[derive(Debug, Clone)]
enum Op {
    Alloc(Vec<i64>),
    Free(Vec<i64>),
    Tail(Vec<i64>, usize),
    Clear,
}

fn op(slots: i64) -> impl Strategy<Value = Op> {
    let list = proptest::collection::vec(-2i64..slots + 3, 0..12);
    prop_oneof![
        4 => list.clone().prop_map(Op::Alloc),
        3 => list.clone().prop_map(Op::Free),
        1 => (list, 0usize..6).prop_map(|(l, k)| Op::Tail(l, k)),
        1 => Just(Op::Clear),
    ]
}

/// The map's invariants (SEMANTICS.md §swa-pool.2) hold after every operation.
fn check_invariants(m: &SwaMapping) -> Result<(), TestCaseError> {
    let p = m.page_size();
    let map = m.map();
    prop_assert_eq!(map.len(), m.size() + p + 1);
    prop_assert_eq!(*map.last().unwrap(), -1);
    prop_assert!(map[..p].iter().all(|&v| v == 0), "dummy page never mapped");
    let mut used = std::collections::BTreeSet::new();
    for page in 1..=m.size() / p {
        match m.swa_page_of(page) {
            None => prop_assert!(map[page * p..(page + 1) * p].iter().all(|&v| v == 0)),
            Some(s) => {
                prop_assert!(s >= 1 && s <= m.size_swa() / p);
                prop_assert!(used.insert(s), "SWA page {} used twice", s);
                for o in 0..p {
                    prop_assert_eq!(map[page * p + o], (s * p + o) as i64);
                }
            }
        }
    }
    prop_assert_eq!(
        used.len() + m.free_swa_pages(),
        m.size_swa() / p,
        "no SWA page leaked"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random alloc / free / tail / clear sequences keep the map page-granular,
    /// offset-preserving, injective and leak-free; errors change nothing.
    #[test]
    fn host_map_invariants(
        p in prop_oneof![Just(1usize), Just(2), Just(4), Just(16), 1usize..=9],
        pages in 1usize..=10,
        swa_pages in 0usize..=8,
        seed_ops in proptest::collection::vec(op(200), 1..30),
    ) {
        let mut m = SwaMapping::new(pages * p, swa_pages * p, p).unwrap();
        let slots = (pages * p + p) as i64;
        for o in seed_ops {
            let before = m.clone();
            let clamp = |l: &[i64]| l.iter().map(|&s| if s >= 0 { s % (slots + 2) } else { s }).collect::<Vec<_>>();
            let res = match &o {
                Op::Alloc(l) => m.alloc_slots(&clamp(l)).map(|_| ()),
                Op::Free(l) => m.free_slots(&clamp(l)).map(|_| ()),
                Op::Tail(l, k) => m.alloc_tail(&clamp(l), *k).map(|_| ()),
                Op::Clear => { m.clear(); Ok(()) }
            };
            if res.is_err() {
                prop_assert_eq!(m.map(), before.map(), "{:?} failed but changed the map", o);
                prop_assert_eq!(m.free_swa_pages(), before.free_swa_pages());
            }
            check_invariants(&m)?;
            // Translation of every location agrees with the map, −1 with −1.
            let all: Vec<i64> = (-1..slots).collect();
            let (out, err) = locs(m.map(), &all);
            prop_assert!(err.is_clean());
            prop_assert_eq!(out[0], -1);
            prop_assert_eq!(&out[1..], &m.map()[..slots as usize]);
        }
    }

    /// A mirror of the slot map and of the page map kept current by
    /// `changed_pages_since` + `update_pages` (what a device copy does)
    /// equals the host maps after every operation; when the log does not
    /// reach back (clear), the mirror re-reads the whole map.
    #[test]
    fn page_updates_keep_a_mirror_exact(
        p in prop_oneof![Just(1usize), Just(4), Just(16), 1usize..=9],
        pages in 1usize..=10,
        swa_pages in 0usize..=8,
        seed_ops in proptest::collection::vec(op(200), 1..30),
        sync_every in 1usize..4,
    ) {
        let mut m = SwaMapping::new(pages * p, swa_pages * p, p).unwrap();
        let slots = (pages * p + p) as i64;
        let mut mirror = m.map().to_vec();
        let mut page_mirror = m.page_map();
        let mut synced = m.version();
        for (i, o) in seed_ops.into_iter().enumerate() {
            let clamp = |l: &[i64]| l.iter().map(|&s| if s >= 0 { s % (slots + 2) } else { s }).collect::<Vec<_>>();
            let _ = match &o {
                Op::Alloc(l) => m.alloc_slots(&clamp(l)).map(|_| ()),
                Op::Free(l) => m.free_slots(&clamp(l)).map(|_| ()),
                Op::Tail(l, k) => m.alloc_tail(&clamp(l), *k).map(|_| ()),
                Op::Clear => { m.clear(); Ok(()) }
            };
            if i % sync_every != 0 {
                continue;
            }
            match m.changed_pages_since(synced) {
                Some(changed) => {
                    let e = m.update_entries(&changed);
                    let err = update_pages(&mut mirror, Some(&mut page_mirror), p, swa_pages + 1, &e);
                    prop_assert!(err.is_clean());
                }
                None => {
                    mirror = m.map().to_vec();
                    page_mirror = m.page_map();
                }
            }
            synced = m.version();
            prop_assert_eq!(&mirror, m.map());
            prop_assert_eq!(&page_mirror, &m.page_map());
        }
    }

    /// Location translation: in-map locations gather, −1 stays −1, the rest
    /// give 0 and are counted once each; the tail is zero.
    #[test]
    fn loc_translation_properties(
        n_map in 1usize..200,
        input in proptest::collection::vec(prop_oneof![4 => 0i64..220, 1 => Just(-1i64), 1 => -5i64..0, 1 => any::<i64>()], 0..64),
        tail in 0usize..5,
    ) {
        let mut map: Vec<i64> = (0..n_map as i64).map(|i| i * 3 % 17).collect();
        *map.last_mut().unwrap() = -1;
        let mut out = vec![i64::MIN; input.len() + tail];
        let err = translate_locs(&map, &input, &mut out);
        let mut events = 0;
        for (i, &l) in input.iter().enumerate() {
            if l >= 0 && (l as usize) < n_map - 1 {
                prop_assert_eq!(out[i], map[l as usize]);
            } else if l == -1 {
                prop_assert_eq!(out[i], -1);
            } else {
                events += 1;
                prop_assert_eq!(out[i], 0);
            }
        }
        prop_assert!(out[input.len()..].iter().all(|&v| v == 0));
        prop_assert_eq!(err.count as usize, events);
    }

    /// Page translation of a page-granular map equals the translation of the
    /// page's first token location divided by P, for every live page.
    #[test]
    fn page_translation_matches_loc_translation(
        p in prop_oneof![Just(1usize), Just(4), Just(16), 1usize..=33],
        full_pages in 2usize..12,
        alloc in proptest::collection::vec(any::<bool>(), 12),
        len in 0usize..40,
    ) {
        let mut m = SwaMapping::new(full_pages * p, full_pages * p, p).unwrap();
        let chosen: Vec<usize> = (1..=full_pages).filter(|&pg| alloc[pg % 12]).collect();
        m.alloc_pages(&chosen).unwrap();
        // One row holding every full page in reverse order.
        let row: Vec<i32> = (1..=full_pages).rev().flat_map(|pg| (0..p).map(move |o| (pg * p + o) as i32)).collect();
        let mm = row.len() / p;
        let l = len.min(row.len());
        let (t, err) = pages(&row, 1, row.len(), &[0], &[l as i32], p, mm, m.map());
        prop_assert!(err.is_clean());
        let n = l.div_ceil(p);
        for page in 0..mm {
            if page < n {
                let mut e = ErrorReport::default();
                let want = translate_one(m.map(), i64::from(row[page * p]), &mut e) / p as i64;
                prop_assert_eq!(i64::from(t[page]), want);
            } else {
                prop_assert_eq!(t[page], POISON);
            }
        }
    }

    /// Location geometry covers every element within CUDA's limits.
    #[test]
    fn loc_launch_config_covers(out_len in 0usize..50_000_000) {
        let cfg = loc_launch_config(out_len).unwrap();
        let blocks = cfg.grid_dim.0 as usize;
        prop_assert!(blocks >= 1 && blocks <= MAX_LOC_BLOCKS as usize);
        prop_assert_eq!(cfg.block_dim.0, BLOCK_THREADS);
        let tile = (BLOCK_THREADS * LOC_UNROLL) as usize;
        // Grid-stride: every element is reached; no block is idle unless out_len is 0.
        prop_assert!(blocks == MAX_LOC_BLOCKS as usize || blocks * tile >= out_len);
        prop_assert!(out_len == 0 || (blocks - 1) * tile < out_len);
    }

    /// Page geometry covers every row, never more chunks than pages need.
    #[test]
    fn page_launch_config_covers(bs in 1usize..5000, m in 1usize..200_000) {
        let cfg = page_launch_config(bs, m).unwrap();
        prop_assert_eq!(cfg.grid_dim.0 as usize, bs);
        prop_assert!(cfg.grid_dim.1 >= 1 && cfg.grid_dim.1 <= 65_535);
        prop_assert!((cfg.grid_dim.1 as usize - 1) * (BLOCK_THREADS as usize) < m);
    }
}

#[test]
fn committed_abi_header_is_current() {
    // The C params structs and flag bits the kernels include are generated
    // from the Rust definitions (`cargo xtask abi`); a stale header fails here.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    kernel_rt::abi::check_committed(dir, &swa_pool::ABI).unwrap();
}
