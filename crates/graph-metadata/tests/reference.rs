//! CPU tests of the graph-metadata family: the "Must pass" examples,
//! the spec's edge cases 7–13, 17–18 and worked examples, replay preparation,
//! modes, the reference's properties (proptest), the launch geometry, the
//! params layout and the PTX. Run everywhere, CI included.

mod common;

use common::{
    case, case_with_page_map, draft_decode_case, padded_decode_case, ragged_case, spec_case_7,
    spec_map, spec_rows, target_verify_case, write_loc_case, Case, POISON,
};
use graph_metadata::reference::{page_map_from_slot_map, HostOutputs};
use graph_metadata::{
    check_ragged_q_lens, launch_config, pad_ragged_verify_lens, prepare_replay, ErrorFlags,
    GraphMetadataParams, GraphMode, BLOCK_THREADS, KERNEL_NAMES, PTX, TARGET_PAGE_BLOCKS,
    UNFUSED_KERNEL_NAMES, UNFUSED_PTX,
};
use kernel_rt::ErrorReport;
use proptest::prelude::*;

fn untouched(v: &[i32]) -> bool {
    v.iter().all(|&x| x == POISON)
}

/// Checks live prefixes `want[row]` and that every tail stays poisoned.
fn assert_pages(out: &HostOutputs, want: &[&[i32]], swa: bool) {
    for (row, w) in want.iter().enumerate() {
        let (t, stride) = if swa {
            (
                out.swa_page_table.as_ref().unwrap(),
                out.swa_page_table_stride,
            )
        } else {
            (&out.page_table, out.page_table_stride)
        };
        assert_eq!(
            &t[row * stride..row * stride + w.len()],
            *w,
            "row {row} (swa {swa})"
        );
        assert!(
            untouched(&t[row * stride + w.len()..(row + 1) * stride]),
            "row {row} tail (swa {swa})"
        );
    }
}

// ---- issue 4: Must pass ---------------------------------------------------

#[test]
fn must_pass_padded_decode() {
    let (out, err) = padded_decode_case().reference();
    assert_eq!(out.cache_seqlens, [5, 3, 4, 1]);
    assert_eq!(out.cu_seqlens_k, [0, 5, 8, 12, 13]);
    assert_eq!(out.cu_seqlens_q.as_deref(), Some(&[0, 1, 2, 3, 4][..]));
    assert_pages(&out, &[&[10, 11], &[15], &[20], &[0]], false);
    assert!(err.is_clean());
    // Had row 3 kept the stale request 7, it would read page 50.
    let mut stale = padded_decode_case();
    stale.rpi[3] = 7;
    assert_eq!(stale.reference().0.page_row(3, 1), [50]);
}

#[test]
fn must_pass_draft_decode() {
    let (out, err) = draft_decode_case(1).reference();
    assert_eq!(out.cache_seqlens, [7, 9]);
    assert_eq!(out.cu_seqlens_k, [0, 7, 16]);
    assert_eq!(out.cu_seqlens_q.as_deref(), Some(&[0, 1, 2][..]));
    assert_pages(&out, &[&[25, 26], &[50, 51, 52]], false);
    assert!(err.is_clean());
    let (out, _) = draft_decode_case(0).reference();
    assert_eq!(out.cache_seqlens, [6, 8]);
    assert_eq!(out.cu_seqlens_k, [0, 6, 14]);
}

#[test]
fn must_pass_target_verify_uses_captured_shape() {
    let (out, err) = target_verify_case().reference();
    assert_eq!(out.cache_seqlens, [7, 5]);
    assert_eq!(out.cu_seqlens_q.as_deref(), Some(&[0, 3, 6][..]));
    assert_eq!(out.cu_seqlens_k, [0, 7, 12]);
    assert_pages(&out, &[&[3, 7], &[5, 9]], false);
    assert!(err.is_clean());
}

#[test]
fn must_pass_swa_write_locations() {
    let (out, err) = write_loc_case(&[12, 13, 16, 17]).reference();
    assert_eq!(out.swa_out_cache_loc.as_deref(), Some(&[20, 21, 4, 5][..]));
    assert!(err.is_clean());
    // Then 2 real tokens, padded to 4: the padding tokens get 0 — and with the
    // buffers of the first replay carried over, nothing of them survives.
    let mut carried = out;
    let next = write_loc_case(&[14, 18]);
    graph_metadata::reference::update_graph_metadata(&next.inputs(), &mut carried);
    assert_eq!(
        carried.swa_out_cache_loc.as_deref(),
        Some(&[22, 6, 0, 0][..])
    );
}

// ---- edge cases 7–13 (SEMANTICS.md §edge-cases) -----------------------------------------------------

#[test]
fn edge_7_normal_decode_padded_bucket() {
    let (out, err) = spec_case_7(&[1, 2, 0, 0]).reference();
    assert_eq!(out.cache_seqlens, [10, 4, 1, 1]);
    assert_eq!(out.cu_seqlens_k, [0, 10, 14, 15, 16]);
    assert_pages(&out, &[&[3, 7, 2], &[5], &[0], &[0]], false);
    assert_pages(&out, &[&[1, 0, 2], &[4], &[0], &[0]], true);
    assert_eq!(
        out.swa_out_cache_loc.as_deref(),
        Some(&[9, 19, 0, 0, 0, 0][..])
    );
    assert!(err.is_clean());
}

#[test]
fn edge_8_stale_padding_request_index() {
    let (out, _) = spec_case_7(&[1, 2, 1, 1]).reference();
    assert_eq!(out.cache_seqlens[2..], [1, 1]);
    assert_pages(&out, &[&[3, 7, 2], &[5], &[3], &[3]], false);
    // The project's replay preparation never leaves them stale (D3).
    let r = prepare_replay(4, 4, &[1, 2], &[10, 4], &[9, 23]).unwrap();
    assert_eq!(r.req_pool_indices, [1, 2, 0, 0]);
}

#[test]
fn edge_9_draft_decode_offsets() {
    for (step, want) in [(0, 6), (1, 7), (2, 8)] {
        let c = Case::new(
            GraphMode::DraftDecode { step },
            &spec_rows(),
            &[1],
            &[5],
            4,
            4,
        );
        assert_eq!(c.reference().0.cache_seqlens, [want]);
    }
    let c = Case::new(
        GraphMode::DraftDecode { step: 1 },
        &spec_rows(),
        &[1, 2],
        &[10, 4],
        4,
        4,
    )
    .with_swa(spec_map(), None);
    let (out, err) = c.reference();
    assert_eq!(out.cache_seqlens, [12, 6]);
    assert_pages(&out, &[&[3, 7, 2], &[5, 9]], false);
    assert_pages(&out, &[&[1, 0, 2], &[4, 5]], true);
    assert!(err.is_clean());
}

#[test]
fn edge_10_target_verify_n3() {
    let c = Case::new(
        GraphMode::TargetVerify { q_len: 3 },
        &spec_rows(),
        &[1, 2],
        &[10, 4],
        4,
        4,
    )
    .with_swa(spec_map(), None);
    let (out, err) = c.reference();
    assert_eq!(out.cache_seqlens, [13, 7]);
    assert_eq!(out.cu_seqlens_k, [0, 13, 20]);
    assert_eq!(out.cu_seqlens_q.as_deref(), Some(&[0, 3, 6][..]));
    assert_pages(&out, &[&[3, 7, 2, 10], &[5, 9]], false);
    assert_pages(&out, &[&[1, 0, 2, 3], &[4, 5]], true);
    assert!(err.is_clean());
}

#[test]
fn edge_11_draft_extend_v2_stride_3() {
    let mode = GraphMode::draft_extend_v2(6, 2).unwrap();
    let (out, err) = Case::new(mode, &spec_rows(), &[1, 2], &[13, 7], 4, 4).reference();
    assert_eq!(out.cache_seqlens, [13, 7]);
    assert_eq!(out.cu_seqlens_q.as_deref(), Some(&[0, 3, 6][..]));
    assert_eq!(out.cu_seqlens_k, [0, 13, 20]);
    assert!(err.is_clean());
}

#[test]
fn edge_12_swa_write_locations_sentinel_and_short_input() {
    let c = Case::new(GraphMode::Decode, &spec_rows(), &[1], &[4], 4, 4)
        .with_swa(spec_map(), Some((Some(vec![-1, 23, 29]), 5)));
    let (out, err) = c.reference();
    assert_eq!(
        out.swa_out_cache_loc.as_deref(),
        Some(&[-1, 19, 0, 0, 0][..])
    );
    assert!(err.is_clean());
    // No out_cache_loc at all: the whole buffer is the zero tail.
    let c = Case::new(GraphMode::Decode, &spec_rows(), &[1], &[4], 4, 4)
        .with_swa(spec_map(), Some((None, 3)));
    assert_eq!(
        c.reference().0.swa_out_cache_loc.as_deref(),
        Some(&[0, 0, 0][..])
    );
}

#[test]
fn edge_13_empty_batch_writes_nothing() {
    let c = Case::new(GraphMode::Decode, &spec_rows(), &[], &[], 4, 4)
        .with_swa(spec_map(), Some((Some(vec![9]), 2)));
    let (out, err) = c.reference();
    assert_eq!(out.cu_seqlens_k, [POISON]);
    assert_eq!(out.cu_seqlens_q.as_deref(), Some(&[POISON][..]));
    assert_eq!(
        out.swa_out_cache_loc.as_deref(),
        Some(&[i64::from(POISON); 2][..])
    );
    assert!(err.is_clean());
}

/// SEMANTICS.md §graph-metadata.6 "width clamp": M 4, seq_len 17 over slots 100..123.
#[test]
fn width_clamp_drops_the_fifth_page_and_counts() {
    let c = Case::new(
        GraphMode::Decode,
        &[(100..124).collect()],
        &[0],
        &[17],
        4,
        4,
    );
    let (out, err) = c.reference();
    assert_eq!(out.page_table, [25, 26, 27, 28]);
    assert_eq!(
        err,
        ErrorReport {
            count: 1,
            flags: ErrorFlags::ROW_CLAMPED.bits()
        }
    );
}

// ---- SWA page map (the optional fast path of the SWA page table) -------------

/// The spec's map (page-granular, SEMANTICS.md §swa-pool.6) as a page map: full pages
/// 3→1, 2→2, 10→3, 5→4, 9→5, the rest (7 evicted) 0; 13 pages of 4 slots.
#[test]
fn page_map_of_the_spec_map() {
    assert_eq!(
        page_map_from_slot_map(&spec_map(), 4).unwrap(),
        [0, 0, 2, 1, 0, 4, 0, 0, 0, 5, 3, 0, 0]
    );
}

/// Slot-map and page-map paths give identical outputs (tables, tails, write
/// locations, error word) on the spec's page-granular map, every mode.
#[test]
fn page_map_path_equals_slot_map_path_on_spec_map() {
    let sr = spec_rows();
    let cases = [
        spec_case_7(&[1, 2, 0, 0]),
        spec_case_7(&[1, 2, 1, 1]),
        Case::new(
            GraphMode::DraftDecode { step: 1 },
            &sr,
            &[1, 2],
            &[10, 4],
            4,
            4,
        )
        .with_swa(spec_map(), None),
        Case::new(
            GraphMode::TargetVerify { q_len: 3 },
            &sr,
            &[1, 2],
            &[10, 4],
            4,
            4,
        )
        .with_swa(spec_map(), Some((Some(vec![9, 23, 29, -1, 12, 13]), 6))),
    ];
    for c in cases {
        let slot = c.reference();
        let page = c.clone().with_page_map().reference();
        assert_eq!(page, slot, "{c:?}");
    }
    let (out, err) = spec_case_7(&[1, 2, 0, 0]).with_page_map().reference();
    assert_pages(&out, &[&[1, 0, 2], &[4], &[0], &[0]], true);
    assert_eq!(
        out.swa_out_cache_loc.as_deref(),
        Some(&[9, 19, 0, 0, 0, 0][..]),
        "write locations still translate through the slot map"
    );
    assert!(err.is_clean());
}

/// No page map reproduces a map whose page entries disagree, or whose slots
/// (N_map − 1) are not whole pages; a page mapped to SWA page 0 or with
/// every entry negative still has one.
#[test]
fn page_map_from_slot_map_needs_whole_consistent_pages() {
    let mut map = spec_map();
    map[13] = 99; // full page 3: 4, 99, 6, 7 → SWA pages 1, 24, 1, 1
    assert_eq!(page_map_from_slot_map(&map, 4), None);
    assert_eq!(page_map_from_slot_map(&spec_map(), 3), None, "52 % 3 != 0");
    assert_eq!(page_map_from_slot_map(&spec_map(), 0), None);
    assert_eq!(page_map_from_slot_map(&[], 4), None);
    assert_eq!(page_map_from_slot_map(&[0, 1, 2, 3, -1], 4), Some(vec![0]));
    assert_eq!(page_map_from_slot_map(&[-1, -5, -1], 2), Some(vec![-1]));
    assert_eq!(
        page_map_from_slot_map(&[1 << 32, (1 << 32) + 1, -1], 2),
        None,
        "SWA page 2^31 is i32::MIN in the table: no page-map entry gives it"
    );
    assert_eq!(
        page_map_from_slot_map(&[1 << 40, (1 << 40) + 1, -1], 2),
        Some(vec![0]),
        "the table keeps the low 32 bits of SWA page 2^39"
    );
    assert_eq!(page_map_from_slot_map(&[7, -1], 1), Some(vec![7]));
}

/// Page-map path edges: a negative slot gives −1 (counted once, by the full
/// table), a slot whose page is past the page map gives 0 (counted as
/// SLOT_OUTSIDE_MAP), a negative entry gives −1, any other entry is copied.
#[test]
fn page_map_path_edges() {
    let rows = vec![vec![
        -3, 0, 0, 0, 40, 0, 0, 0, 8, 0, 0, 0, 12, 0, 0, 0, 20, 0, 0, 0,
    ]];
    let mut c = Case::new(GraphMode::Decode, &rows, &[0], &[20], 4, 5).with_swa(spec_map(), None);
    //               page: 0  1  2   3  4  5   6  7  8  9
    c.page_map = Some(vec![0, 0, 7, -4, 0, 9, 0, 0, 0, 0]);
    let (out, err) = c.reference();
    // slots -3, 40 (page 10: past the 10-entry map), 8 (page 2), 12 (page 3), 20 (page 5)
    assert_pages(&out, &[&[-1, 0, 7, -1, 9]], true);
    assert_pages(&out, &[&[0, 10, 2, 3, 5]], false);
    assert_eq!(
        err,
        ErrorReport {
            count: 2,
            flags: ErrorFlags::NEGATIVE_SLOT.bits() | ErrorFlags::SLOT_OUTSIDE_MAP.bits()
        }
    );
}

/// D1: both prefix sums' entry 0 is written, whatever the buffer held.
#[test]
fn entry_zero_of_prefix_sums_is_written() {
    let (out, _) = padded_decode_case().reference();
    assert_eq!(out.cu_seqlens_k[0], 0);
    assert_eq!(out.cu_seqlens_q.unwrap()[0], 0);
}

// ---- edge cases 17–18 (SEMANTICS.md §edge-cases): ragged verify -------------------------------------

#[test]
fn edge_17_ragged_padding_to_the_bucket() {
    assert_eq!(
        pad_ragged_verify_lens(&[2, 1, 3], 8, 8).unwrap(),
        [2, 1, 3, 1, 1, 0, 0, 0]
    );
    assert_eq!(
        pad_ragged_verify_lens(&[2, 1, 3], 8, 5).unwrap(),
        [2, 1, 3, 1, 1]
    );
    assert_eq!(pad_ragged_verify_lens(&[2, 1, 3], 8, 3).unwrap(), [2, 1, 5]);
    let wide = pad_ragged_verify_lens(&[2, 1, 3], 12, 4).unwrap();
    assert_eq!(wide, [2, 1, 3, 6]);
    assert!(
        check_ragged_q_lens(&wide, 4).is_err(),
        "padding row 6 > N = 4 is refused on the host"
    );
    assert!(check_ragged_q_lens(&[2, 1, 3, 1, 1], 4).is_ok());
    assert!(
        pad_ragged_verify_lens(&[2, 1, 3], 5, 4).is_err(),
        "lengths exceed the bucket"
    );
    assert!(
        pad_ragged_verify_lens(&[2, 1, 3], 8, 2).is_err(),
        "rows exceed bs"
    );
}

#[test]
fn edge_18_ragged_geometry() {
    let (out, err) = ragged_case().reference();
    assert_eq!(out.cache_seqlens, [12, 5, 9, 2, 2]);
    assert_eq!(out.cu_seqlens_k, [0, 12, 17, 26, 28, 30]);
    assert_eq!(out.cu_seqlens_q.as_deref(), Some(&[0, 2, 3, 6, 7, 8][..]));
    assert!(err.is_clean());
    // A too-long row not caught on the host is clamped on the device, counted.
    let mut c = ragged_case();
    c.qlens = Some(vec![2, 1, 3, 6, 0]);
    let (out, err) = c.reference();
    assert_eq!(out.cache_seqlens[3], 5);
    assert_eq!(out.cu_seqlens_q.as_deref(), Some(&[0, 2, 3, 6, 10, 10][..]));
    assert_eq!(
        err,
        ErrorReport {
            count: 1,
            flags: ErrorFlags::QLEN_OUT_OF_RANGE.bits()
        }
    );
}

// ---- device-data events -------------------------------------------------------

#[test]
fn out_of_domain_device_data_is_counted() {
    // seq_len + offset outside [0, i32::MAX] clamps; the sum overflows i32.
    let c = Case::new(
        GraphMode::Decode,
        &spec_rows(),
        &[0, 0, 0],
        &[-5, i64::MAX, 7],
        4,
        4,
    );
    let (out, err) = c.reference();
    assert_eq!(out.cache_seqlens, [0, i32::MAX, 7]);
    assert_eq!(out.cu_seqlens_k, [0, 0, i32::MAX, i32::MAX.wrapping_add(7)]);
    let want = ErrorFlags::SEQLEN_OUT_OF_RANGE.bits()
        | ErrorFlags::SUM_OVERFLOW.bits()
        | ErrorFlags::ROW_CLAMPED.bits();
    assert_eq!(
        err,
        ErrorReport {
            count: 4,
            flags: want
        }
    );
    // Bad request index skips the row; a write location past the map gives 0.
    let c = Case::new(GraphMode::Decode, &spec_rows(), &[3], &[4], 4, 4)
        .with_swa(spec_map(), Some((Some(vec![52, 53, 1000, 12]), 4)));
    let (out, err) = c.reference();
    assert!(untouched(&out.page_table));
    assert_eq!(out.swa_out_cache_loc.as_deref(), Some(&[0, 0, 0, 4][..]));
    let want = ErrorFlags::BAD_REQUEST_INDEX.bits() | ErrorFlags::LOC_OUTSIDE_MAP.bits();
    assert_eq!(
        err,
        ErrorReport {
            count: 4,
            flags: want
        }
    );
}

// ---- modes and replay preparation --------------------------------------------

#[test]
fn modes_give_spec_offsets_and_strides() {
    assert_eq!(
        (
            GraphMode::Decode.seqlen_offset(),
            GraphMode::Decode.q_stride()
        ),
        (0, 1)
    );
    let d = GraphMode::DraftDecode { step: 2 };
    assert_eq!((d.seqlen_offset(), d.q_stride()), (3, 1));
    let v = GraphMode::target_verify(12, 4).unwrap();
    assert_eq!(
        (v.seqlen_offset(), v.q_stride(), v.num_tokens(4)),
        (3, 3, 12)
    );
    let e = GraphMode::draft_extend_v2(8, 4).unwrap();
    assert_eq!((e.seqlen_offset(), e.q_stride()), (0, 2));
    assert_eq!(GraphMode::RaggedVerify { max_q_len: 4 }.seqlen_offset(), 0);
    assert!(GraphMode::target_verify(6, 4).is_err());
    assert!(GraphMode::target_verify(0, 4).is_err());
    assert!(GraphMode::draft_extend_v2(4, 0).is_err());
}

#[test]
fn replay_preparation_pads_and_rejects() {
    let r = prepare_replay(4, 6, &[5], &[9], &[11, 12]).unwrap();
    assert_eq!(r.req_pool_indices, [5, 0, 0, 0]);
    assert_eq!(r.seq_lens, [9, 1, 1, 1]);
    assert_eq!(r.out_cache_loc, [11, 12, 0, 0, 0, 0]);
    assert!(prepare_replay(1, 1, &[1, 2], &[1, 1], &[]).is_err());
    assert!(prepare_replay(2, 1, &[1, 2], &[1], &[]).is_err());
    assert!(prepare_replay(2, 1, &[1], &[1], &[1, 2]).is_err());
}

// ---- params, PTX, geometry ------------------------------------------------------

#[test]
fn params_layout_matches_cuda() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<GraphMetadataParams>(), 232);
    assert_eq!(offset_of!(GraphMetadataParams, out_cache_loc), 32);
    assert_eq!(offset_of!(GraphMetadataParams, qlens), 40);
    assert_eq!(offset_of!(GraphMetadataParams, cache_seqlens), 48);
    assert_eq!(offset_of!(GraphMetadataParams, errors), 96);
    assert_eq!(offset_of!(GraphMetadataParams, req_to_token_rows), 104);
    assert_eq!(offset_of!(GraphMetadataParams, seqlen_offset), 176);
    assert_eq!(offset_of!(GraphMetadataParams, bs), 184);
    assert_eq!(offset_of!(GraphMetadataParams, q_stride), 196);
    assert_eq!(offset_of!(GraphMetadataParams, swa_blocks), 204);
    assert_eq!(offset_of!(GraphMetadataParams, max_q_len), 208);
    assert_eq!(offset_of!(GraphMetadataParams, swa_page_map), 216);
    assert_eq!(offset_of!(GraphMetadataParams, swa_page_map_len), 224);
    // The PTX declares one 232-byte parameter for every entry, as the struct.
    assert!(PTX.ptx.contains("graph_metadata_update_param_0[232]"));
    for name in UNFUSED_KERNEL_NAMES {
        assert!(
            UNFUSED_PTX.ptx.contains(&format!("{name}_param_0[232]")),
            "{name}"
        );
    }
}

#[test]
fn ptx_has_every_kernel_name() {
    for name in KERNEL_NAMES {
        assert!(PTX.has_entry(name), "{name} missing from the PTX");
    }
    for name in UNFUSED_KERNEL_NAMES {
        assert!(
            UNFUSED_PTX.has_entry(name),
            "{name} missing from the unfused PTX"
        );
    }
    assert!(!PTX.has_entry("graph_metadata"), "prefix must not match");
}

#[test]
fn committed_ptx_is_fresh() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = dir.join("../..");
    for (cu, ptx) in [
        ("graph_metadata.cu", PTX.ptx),
        ("graph_metadata_unfused.cu", UNFUSED_PTX.ptx),
    ] {
        kernel_rt::ptxhash::check_fresh(&root, &dir.join("kernels").join(cu), ptx).unwrap();
    }
}

/// The embedded sm_90 cubins were assembled from the embedded PTX by the
/// pinned ptxas (their stamps; no CUDA needed).
#[test]
fn committed_cubins_are_fresh() {
    for module in [&PTX, &UNFUSED_PTX] {
        kernel_rt::ptxhash::check_cubin(module).unwrap();
    }
}

#[test]
fn empty_batch_has_no_geometry() {
    assert!(launch_config(0, 8, 8).is_err());
}

/// Independent restatement of SEMANTICS.md §graph-metadata.2 for the property test.
fn expected_cache_len(c: &Case, i: usize) -> (i64, i64) {
    let q = match c.mode {
        GraphMode::RaggedVerify { max_q_len } => {
            i64::from(c.qlens.as_ref().unwrap()[i]).clamp(0, i64::from(max_q_len))
        }
        _ => 0,
    };
    let raw = i128::from(c.seq_lens[i]) + i128::from(c.mode.seqlen_offset()) + i128::from(q);
    (raw.clamp(0, i128::from(i32::MAX)) as i64, q)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(768))]

    /// Every output equals the spec formula: per-row lengths, both prefix
    /// sums (entry 0 included), live prefixes (tails untouched), SWA pages,
    /// write locations with their zero tail.
    #[test]
    fn reference_matches_spec_formulas(c in case()) {
        let (out, _err) = c.reference();
        let bs = c.bs();
        if bs == 0 {
            prop_assert!(untouched(&out.cu_seqlens_k));
            return Ok(());
        }
        let mut run = 0i64;
        let mut run_q = 0i64;
        prop_assert_eq!(out.cu_seqlens_k[0], 0);
        for i in 0..bs {
            let (len, q) = expected_cache_len(&c, i);
            prop_assert_eq!(i64::from(out.cache_seqlens[i]), len);
            run += len;
            run_q += q;
            prop_assert_eq!(out.cu_seqlens_k[i + 1], run as i32);
            if let Some(cu_q) = &out.cu_seqlens_q {
                let want = if c.qlens.is_some() { run_q } else { (i as i64 + 1) * i64::from(c.mode.q_stride()) };
                prop_assert_eq!(i64::from(cu_q[i + 1]), want);
            }
            let r = c.rpi[i];
            let n = if r < 0 || r as usize >= c.rows {
                0
            } else {
                (len as usize).div_ceil(c.p).min(c.m).min(c.width.div_ceil(c.p))
            };
            for page in 0..c.pt_stride {
                let got = out.page_table[i * c.pt_stride + page];
                if page >= n {
                    prop_assert_eq!(got, POISON);
                    continue;
                }
                let slot = i64::from(c.r2t[r as usize * c.r2t_stride + page * c.p]);
                let ok = slot >= 0 && c.pool_slots.is_none_or(|ps| slot < ps as i64);
                prop_assert_eq!(got, if ok { (slot / c.p as i64) as i32 } else { 0 });
                if let (Some(map), Some(swa)) = (&c.map, &out.swa_page_table) {
                    let want = if slot < 0 {
                        -1
                    } else if slot as usize >= map.len() - 1 {
                        0
                    } else if map[slot as usize] < 0 {
                        -1
                    } else {
                        (map[slot as usize] / c.p as i64) as i32
                    };
                    prop_assert_eq!(swa[i * c.pt_stride + page], want);
                }
            }
        }
        if let (Some(map), Some(dst), Some((src, _))) = (&c.map, &out.swa_out_cache_loc, &c.write_locs) {
            let src = src.as_deref().unwrap_or(&[]);
            for (j, &d) in dst.iter().enumerate() {
                let want = match src.get(j) {
                    None => 0,
                    Some(&l) if l < 0 => -1,
                    Some(&l) if l as usize >= map.len() - 1 => 0,
                    Some(&l) => map[l as usize],
                };
                prop_assert_eq!(d, want);
            }
        }
    }

    /// The page-map path equals its formula for arbitrary page maps (entries
    /// negative, 0, huge; maps shorter than the pool), and every other output
    /// equals the slot-map path's.
    #[test]
    fn page_map_path_matches_its_formula(c in case_with_page_map()) {
        let (out, err) = c.reference();
        let mut slot_case = c.clone();
        slot_case.page_map = None;
        let (slot_out, slot_err) = slot_case.reference();
        prop_assert_eq!(&out.page_table, &slot_out.page_table);
        prop_assert_eq!(&out.swa_out_cache_loc, &slot_out.swa_out_cache_loc);
        prop_assert_eq!(&out.cu_seqlens_k, &slot_out.cu_seqlens_k);
        let Some(pages) = &c.page_map else {
            prop_assert_eq!(out, slot_out);
            prop_assert_eq!(err, slot_err);
            return Ok(());
        };
        let swa = out.swa_page_table.as_ref().unwrap();
        for i in 0..c.bs() {
            let r = c.rpi[i];
            let n = if r < 0 || r as usize >= c.rows {
                0
            } else {
                (out.cache_seqlens[i] as usize).div_ceil(c.p).min(c.m).min(c.width.div_ceil(c.p))
            };
            for page in 0..c.pt_stride {
                let got = swa[i * c.pt_stride + page];
                if page >= n {
                    prop_assert_eq!(got, POISON);
                    continue;
                }
                let slot = i64::from(c.r2t[r as usize * c.r2t_stride + page * c.p]);
                let want = if slot < 0 {
                    -1
                } else {
                    pages.get(slot as usize / c.p).map_or(0, |&e| e.max(-1))
                };
                prop_assert_eq!(got, want);
            }
        }
    }

    /// On a page-granular slot map the two paths give identical outputs and
    /// error words.
    #[test]
    fn page_map_path_equals_slot_map_path_on_granular_maps(c in case()) {
        if !c.has_swa_table() {
            return Ok(());
        }
        let g = c.granular();
        let slot = g.reference();
        let page = g.with_page_map().reference();
        prop_assert_eq!(page, slot);
    }

    /// Replay preparation: real rows kept, every padding entry set.
    #[test]
    fn replay_preparation_sets_every_entry(
        bs in 1usize..16, extra in 0usize..5, raw in proptest::collection::vec((0i64..100, 1i64..1000), 0..16),
    ) {
        let raw = &raw[..raw.len().min(bs)];
        let rpi: Vec<i64> = raw.iter().map(|x| x.0).collect();
        let lens: Vec<i64> = raw.iter().map(|x| x.1).collect();
        let tokens = bs + extra;
        let locs: Vec<i64> = (0..raw.len() as i64).map(|t| 100 + t).collect();
        let r = prepare_replay(bs, tokens, &rpi, &lens, &locs).unwrap();
        prop_assert_eq!(&r.req_pool_indices[..raw.len()], &rpi[..]);
        prop_assert!(r.req_pool_indices[raw.len()..].iter().all(|&v| v == 0));
        prop_assert!(r.seq_lens[raw.len()..].iter().all(|&v| v == 1));
        prop_assert_eq!(r.out_cache_loc.len(), tokens);
        prop_assert!(r.out_cache_loc[raw.len()..].iter().all(|&v| v == 0));
    }

    /// Ragged padding covers the bucket exactly and keeps the real rows.
    #[test]
    fn ragged_padding_covers_the_bucket(
        lens in proptest::collection::vec(1i32..6, 1..8), pads in 0usize..5, slack in 0usize..12,
    ) {
        let sum: usize = lens.iter().map(|&l| l as usize).sum();
        let bs = lens.len() + pads;
        let out = pad_ragged_verify_lens(&lens, sum + slack, bs).unwrap();
        prop_assert_eq!(out.len(), bs);
        prop_assert_eq!(out.iter().map(|&l| l as usize).sum::<usize>(), sum + slack);
        prop_assert_eq!(&out[..lens.len() - 1], &lens[..lens.len() - 1]);
        if pads > 0 {
            let pad = &out[lens.len()..];
            prop_assert!(pad.iter().max().unwrap() - pad.iter().min().unwrap() <= 1);
        }
    }

    /// Geometry: block 0 + bs·chunks page blocks + SWA blocks, chunks cover
    /// M pages with no idle chunk, within CUDA's grid limit.
    #[test]
    fn launch_config_covers_every_output(bs in 1usize..5000, m in 1usize..200_000, n_swa in 0usize..2_000_000) {
        let plan = launch_config(bs, m, n_swa).unwrap();
        let chunks = plan.page_chunks as usize;
        let t = BLOCK_THREADS as usize;
        prop_assert!(chunks >= 1);
        prop_assert!((chunks - 1) * t < m, "no chunk without a page");
        // The kernel's 32-bit page indices rely on this bound.
        prop_assert!(chunks <= TARGET_PAGE_BLOCKS);
        // About one wave: the page blocks stay within the target when rows allow.
        prop_assert!(bs * chunks <= TARGET_PAGE_BLOCKS.max(bs));
        prop_assert!(chunks == m.div_ceil(t) || bs * (chunks + 1) > TARGET_PAGE_BLOCKS);
        prop_assert_eq!(plan.cfg.grid_dim.0 as usize, 1 + bs * chunks + plan.swa_blocks as usize);
        prop_assert_eq!((plan.cfg.grid_dim.1, plan.cfg.grid_dim.2), (1, 1));
        prop_assert_eq!(plan.cfg.block_dim, (BLOCK_THREADS, 1, 1));
        prop_assert_eq!(plan.swa_blocks == 0, n_swa == 0);
        prop_assert!((plan.swa_blocks as usize) * t >= n_swa.min(1024 * t));
    }
}

#[test]
fn committed_abi_header_is_current() {
    // The C params structs and flag bits the kernels include are generated
    // from the Rust definitions (`cargo xtask abi`); a stale header fails here.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    kernel_rt::abi::check_committed(dir, &graph_metadata::ABI).unwrap();
}
