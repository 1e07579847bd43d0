//! CPU-executor tests: every mode on small random batches against a direct
//! computation, edge cases 14–19 (SEMANTICS.md §edge-cases), empty / IDLE
//! batches, pool exhaustion, config errors, multi-step draft.

#[path = "common/models.rs"]
mod models;
#[path = "common/sim.rs"]
mod sim;

use mha_backend::{
    AttnMode, BackendConfig, BackendError, Device, ForwardBatch, ForwardMode, HalfDtype,
    KvCacheDtype, KvSnapshot, MhaBackend, MultiStepDraftBackend, SpecConfig, SpecInfo, Tensor,
    TensorRef,
};
use models::{dense_config, fp8_config, hybrid_config};
use rand::Rng;
use sim::{bf16, Part, Sim};

/// A named config mutation.
type Mutation = (&'static str, fn(&mut BackendConfig));

// ---------------------------------------------------------------- random sessions

/// A random sequence of steps in every mode, requests arriving and finishing,
/// lengths crossing page boundaries (P = 4).
fn random_session(config: BackendConfig, seed: u64, steps: usize) {
    let mut sim = Sim::checked(config.clone(), seed);
    let hybrid = config.num_swa_pages.is_some();
    let mut live: Vec<usize> = Vec::new();
    let mut modes = std::collections::BTreeSet::new();
    let mut evicted = 0;
    for _ in 0..steps {
        // Arrivals / departures.
        if live.len() < 2 || (live.len() < 4 && sim.rng.gen_bool(0.3)) {
            let r = sim.new_request();
            let n = sim.rng.gen_range(1..=9);
            sim.extend(&[(r, n)], false);
            live.push(r);
            continue;
        }
        if sim.rng.gen_bool(0.1) || live.iter().any(|&r| sim.len(r) > 70) {
            let i = sim.rng.gen_range(0..live.len());
            let r = live.swap_remove(i);
            sim.backend.free_request(r).unwrap();
            for h in &mut sim.hist {
                h.remove(&r);
            }
            continue;
        }
        if hybrid {
            for &r in &live {
                let len = sim.len(r);
                evicted += sim.backend.evict_swa(r, len).unwrap();
            }
        }
        let k = sim.rng.gen_range(1..=live.len());
        let reqs: Vec<usize> = live[..k].to_vec();
        let mode = sim.rng.gen_range(0..6);
        modes.insert(mode);
        match mode {
            0 => {
                sim.decode(&reqs);
            }
            1 => {
                let grow: Vec<(usize, usize)> = reqs
                    .iter()
                    .map(|&r| (r, sim.rng.gen_range(0..=5)))
                    .collect();
                sim.extend(&grow, true);
            }
            2 => {
                let n = sim.rng.gen_range(1..=4);
                sim.verify(&reqs, &vec![n; reqs.len()], false);
            }
            3 => {
                let lens: Vec<usize> = reqs.iter().map(|_| sim.rng.gen_range(1..=4)).collect();
                sim.verify(&reqs, &lens, true);
            }
            4 => {
                let n = sim.rng.gen_range(1..=3);
                sim.draft_extend(&reqs, n);
            }
            _ => {
                sim.draft_decode(&reqs, 0);
                sim.draft_decode(&reqs, 1);
            }
        }
    }
    assert_eq!(modes.len(), 6, "every mode exercised");
    assert!(!hybrid || evicted > 0, "SWA eviction exercised");
}

#[test]
fn every_mode_dense_random() {
    random_session(dense_config(), 1, 120);
}

#[test]
fn every_mode_hybrid_swa_random() {
    random_session(hybrid_config(), 2, 120);
}

#[test]
fn every_mode_fp8_random() {
    random_session(fp8_config(), 3, 120);
}

/// Decode context parallelism simulated over 2..=4 ranks (page
/// interleave, P = 4): every mode against the unsplit oracle — windows and
/// sinks on the hybrid model (sinks joined once after the merge), FP8.
#[test]
fn every_mode_decode_cp_random() {
    for (i, (mut c, ranks)) in [
        (dense_config(), 2),
        (hybrid_config(), 3),
        (fp8_config(), 4),
        (hybrid_config(), 2),
    ]
    .into_iter()
    .enumerate()
    {
        c.decode_cp_ranks = ranks;
        random_session(c, 40 + i as u64, 100);
    }
}

#[test]
fn f16_model_page_size_1() {
    let mut c = dense_config();
    c.model_dtype = HalfDtype::F16;
    c.kv_dtype = KvCacheDtype::F16;
    c.page_size = 1;
    c.num_pages = 256;
    // The oracle reads bf16 bits; f16 is checked by a bit-copy round trip below.
    let mut b = MhaBackend::new(c, Device::Cpu).unwrap();
    let r = b.alloc_request().unwrap();
    let loc = b.alloc_tokens(&[(r, 3)]).unwrap();
    let batch = ForwardBatch::extend(vec![r as i64], vec![0], vec![3], loc.clone(), false);
    b.init_forward_metadata(&batch).unwrap();
    let k: Vec<u16> = (0..3 * 128)
        .map(|i| half::f16::from_f32(i as f32 / 100.0).to_bits())
        .collect();
    let q = vec![half::f16::from_f32(0.0).to_bits(); 3 * 256];
    let out = b
        .forward(
            0,
            TensorRef::Host(&q),
            Some(TensorRef::Host(&k)),
            Some(TensorRef::Host(&k)),
            &batch,
            true,
        )
        .unwrap()
        .into_host()
        .unwrap();
    // q = 0: uniform weights, row j is the mean of V rows 0..=j (P = 1 tables).
    let m = b.metadata().unwrap();
    assert_eq!(
        m.page_row(0, 1),
        &[loc[0] as i32, loc[1] as i32, loc[2] as i32]
    );
    let KvSnapshot::Half { k: kc, .. } = b.read_kv_cache(0).unwrap() else {
        panic!()
    };
    assert_eq!(&kc[loc[2] as usize * 128..][..128], &k[256..384]);
    let v10 = half::f16::from_bits(out[256]).to_f64(); // row 1, head 0, dim 0
    let expect =
        (half::f16::from_bits(k[0]).to_f64() + half::f16::from_bits(k[128]).to_f64()) / 2.0;
    assert!((v10 - expect).abs() < 1e-3);
}

// ---------------------------------------------------------------- edge cases 14–19

fn backend_with_requests(n: usize) -> (MhaBackend, Vec<usize>) {
    let b = MhaBackend::new(dense_config(), Device::Cpu).unwrap();
    let rows = (0..n).map(|_| b.alloc_request().unwrap()).collect();
    (b, rows)
}

#[test]
fn edge_14_plain_prefill_no_prefix() {
    let (mut b, r) = backend_with_requests(2);
    let loc = b.alloc_tokens(&[(r[0], 3), (r[1], 2)]).unwrap();
    let batch = ForwardBatch::extend(
        vec![r[0] as i64, r[1] as i64],
        vec![0, 0],
        vec![3, 2],
        loc,
        false,
    );
    let m = b.init_forward_metadata(&batch).unwrap();
    assert_eq!(m.mode, AttnMode::Extend);
    assert_eq!(m.cu_seqlens_k, vec![0, 3, 5]);
    assert_eq!(m.cu_seqlens_q, m.cu_seqlens_k);
    assert_eq!(m.max_seq_len_q, 3);
    assert_eq!(m.cache_seqlens, vec![3, 2]);
}

#[test]
fn edge_15_mixed_batch() {
    // A: prefix 3, extend 2; B (a decode inside the mixed batch): prefix 7, extend 1.
    let mut sim = Sim::checked(dense_config(), 15);
    let [a, bq] = sim.prefill([3, 7]);
    let loc = sim.backend.alloc_tokens(&[(a, 2), (bq, 1)]).unwrap();
    let batch = ForwardBatch::extend(
        vec![a as i64, bq as i64],
        vec![3, 7],
        vec![2, 1],
        loc.clone(),
        true,
    );
    assert_eq!(batch.seq_lens, vec![5, 8]);
    let m = sim.backend.init_forward_metadata(&batch).unwrap();
    assert_eq!(m.cu_seqlens_k, vec![0, 5, 13]);
    assert_eq!(m.cu_seqlens_q, vec![0, 2, 3]);
    assert_eq!(m.max_seq_len_q, 2);
    // Query positions A 3, 4 and B 7: checked by the direct computation.
    let parts = [
        Part {
            req: a,
            n: 2,
            len: 5,
        },
        Part {
            req: bq,
            n: 1,
            len: 8,
        },
    ];
    sim.run(&batch, &parts);
}

#[test]
fn edge_16_uniform_target_verify() {
    let mut sim = Sim::checked(dense_config(), 16);
    let [a, bq] = sim.prefill([10, 4]);
    let loc = sim.backend.alloc_tokens(&[(a, 3), (bq, 3)]).unwrap();
    let batch = ForwardBatch::target_verify(vec![a as i64, bq as i64], vec![10, 4], loc, None);
    let m = sim.backend.init_forward_metadata(&batch).unwrap();
    assert_eq!(m.mode, AttnMode::TargetVerify { q_len: 3 });
    assert_eq!(m.cu_seqlens_q, vec![0, 3, 6]);
    assert_eq!(m.cache_seqlens, vec![13, 7]);
    assert_eq!(m.cu_seqlens_k, vec![0, 13, 20]);
    assert_eq!(m.max_seq_len_q, 3);
    sim.run(
        &batch,
        &[
            Part {
                req: a,
                n: 3,
                len: 13,
            },
            Part {
                req: bq,
                n: 3,
                len: 7,
            },
        ],
    );
}

#[test]
fn edge_17_ragged_padding_to_bucket() {
    let batch = ForwardBatch::target_verify(
        vec![1, 2, 3],
        vec![10, 4, 6],
        vec![9; 6],
        Some(vec![2, 1, 3]),
    );
    let lens = |b: &ForwardBatch| b.verify_lens().unwrap().to_vec();
    let p = batch.pad_to_bucket(8, 8, 4).unwrap();
    assert_eq!(lens(&p), vec![2, 1, 3, 1, 1, 0, 0, 0]);
    assert_eq!(p.seq_lens, vec![10, 4, 6, 1, 1, 1, 1, 1]);
    assert_eq!(p.req_pool_indices, vec![1, 2, 3, 0, 0, 0, 0, 0]);
    assert_eq!(p.out_cache_loc, vec![9, 9, 9, 9, 9, 9, 0, 0]);
    assert_eq!(
        lens(&batch.pad_to_bucket(5, 8, 4).unwrap()),
        vec![2, 1, 3, 1, 1]
    );
    assert_eq!(lens(&batch.pad_to_bucket(3, 8, 5).unwrap()), vec![2, 1, 5]);
    // Bucket 12, 4 slots: a padding row of 6 > N = 4 is rejected on the host.
    assert!(matches!(
        batch.pad_to_bucket(4, 12, 4),
        Err(BackendError::Kernel(_))
    ));
    // Eager metadata of the 5-slot padding.
    let (mut b, _) = backend_with_requests(3);
    let padded = batch.pad_to_bucket(5, 8, 4).unwrap();
    let m = b.init_forward_metadata(&padded).unwrap();
    assert_eq!(m.cu_seqlens_q, vec![0, 2, 3, 6, 7, 8]);
}

#[test]
fn edge_18_19_ragged_geometry_and_attention() {
    // seq_lens [10, 4, 6, 1, 1] (last two padding), padded lens [2, 1, 3, 1, 1].
    let (mut b, _) = backend_with_requests(3);
    let batch = ForwardBatch::target_verify(
        vec![1, 2, 3, 0, 0],
        vec![10, 4, 6, 1, 1],
        vec![0; 8],
        Some(vec![2, 1, 3, 1, 1]),
    );
    let m = b.init_forward_metadata(&batch).unwrap();
    assert!(m.is_ragged_verify);
    assert_eq!(m.cache_seqlens, vec![12, 5, 9, 2, 2]);
    assert_eq!(m.cu_seqlens_k, vec![0, 12, 17, 26, 28, 30]);
    assert_eq!(m.cu_seqlens_q, vec![0, 2, 3, 6, 7, 8]);
    assert_eq!(m.max_seq_len_q, 3);
    // Edge 19: ragged verify is supported (one flavor, D5): attention
    // against the direct computation.
    let mut sim = Sim::checked(hybrid_config(), 19);
    let reqs = sim.prefill([10, 4, 6]);
    sim.verify(&reqs, &[2, 1, 3], true);
}

// ---------------------------------------------------------------- other named cases

#[test]
fn empty_batch_and_idle_do_nothing() {
    let (mut b, _) = backend_with_requests(1);
    let before = b.pools_snapshot();
    let kv = b.read_kv_cache(0).unwrap();
    for batch in [
        ForwardBatch::idle(),
        ForwardBatch::decode(vec![], vec![], vec![]),
        ForwardBatch::extend(vec![], vec![], vec![], vec![], false),
        ForwardBatch::target_verify(vec![], vec![], vec![], None),
        ForwardBatch::target_verify(vec![], vec![], vec![], Some(vec![])),
        ForwardBatch::draft_extend_v2(vec![], vec![], vec![], 2),
        ForwardBatch::draft_decode(vec![], vec![], vec![], None),
    ] {
        let m = b.init_forward_metadata(&batch).unwrap();
        assert_eq!(m.num_tokens, 0);
        assert!(m.cache_seqlens.is_empty() && m.page_table.is_empty());
        assert_eq!(m.cu_seqlens_k, vec![0]);
        let out = b
            .forward(
                1,
                TensorRef::Host(&[]),
                Some(TensorRef::Host(&[])),
                Some(TensorRef::Host(&[])),
                &batch,
                true,
            )
            .unwrap();
        assert!(out.is_empty());
    }
    assert_eq!(b.pools_snapshot(), before);
    assert_eq!(b.read_kv_cache(0).unwrap(), kv);
}

#[test]
fn exhaustion_is_an_error_and_changes_nothing() {
    let mut c = hybrid_config();
    c.num_pages = 6;
    c.num_swa_pages = Some(4);
    let mut sim = Sim::checked(c, 7);
    let [a] = sim.prefill([13]); // 4 pages of 6 (P = 4), 4 SWA pages of 4
    let bq = sim.new_request();
    let before = sim.backend.pools_snapshot();
    let kv = sim.caches();
    // Full pool: 3 pages needed (a: 13 → 21 = 2 new pages; b: 1 page), 2 free.
    let e = sim.backend.alloc_tokens(&[(a, 8), (bq, 4)]).unwrap_err();
    assert!(
        matches!(
            e,
            BackendError::Exhausted {
                pool: "full",
                needed: 3,
                free: 2
            }
        ),
        "{e}"
    );
    // SWA pool: 1 full page free enough, but no SWA page left.
    let e = sim.backend.alloc_tokens(&[(bq, 1)]).unwrap_err();
    assert!(
        matches!(
            e,
            BackendError::Exhausted {
                pool: "swa",
                needed: 1,
                free: 0
            }
        ),
        "{e}"
    );
    // Context overflow and unknown requests are errors too.
    assert!(matches!(
        sim.backend.alloc_tokens(&[(a, 200)]),
        Err(BackendError::ContextOverflow { .. })
    ));
    assert!(matches!(
        sim.backend.alloc_tokens(&[(0, 1)]),
        Err(BackendError::UnknownRequest(0))
    ));
    assert_eq!(sim.backend.pools_snapshot(), before);
    for (l, s) in kv.iter().enumerate() {
        assert_eq!(&sim.backend.read_kv_cache(l).unwrap(), s);
    }
    // Eviction of out-of-window SWA pages makes room (window 5, P = 4).
    assert_eq!(sim.backend.evict_swa(a, 13).unwrap(), 2);
    sim.decode(&[a]);
    // Freeing returns every page.
    sim.backend.free_request(a).unwrap();
    assert_eq!(
        sim.backend
            .with_pools(|p| (p.free_pages(), p.free_swa_pages())),
        (6, 4)
    );
    assert!(sim
        .backend
        .with_pools(|p| p.req_to_token().iter().all(|&s| s == 0)));
}

#[test]
fn request_rows_and_row_zero() {
    let mut c = dense_config();
    c.max_requests = 2;
    let b = MhaBackend::new(c, Device::Cpu).unwrap();
    let r1 = b.alloc_request().unwrap();
    let r2 = b.alloc_request().unwrap();
    assert!(r1 != 0 && r2 != 0 && r1 != r2);
    assert!(matches!(
        b.alloc_request(),
        Err(BackendError::NoFreeRequestRow { rows: 2 })
    ));
    b.alloc_tokens(&[(r1, 5)]).unwrap();
    b.with_pools(|p| {
        assert!(p.req_to_token()[..p.req_to_token_width()]
            .iter()
            .all(|&s| s == 0))
    });
    b.truncate_request(r1, 2).unwrap();
    assert_eq!(b.with_pools(|p| p.free_pages()), 63);
    b.free_request(r1).unwrap();
    assert_eq!(b.alloc_request().unwrap(), r1);
}

#[test]
fn config_errors_are_typed() {
    let mut c = dense_config();
    c.spec = Some(SpecConfig {
        num_steps: 3,
        num_draft_tokens: 3,
        topk: 2,
    });
    assert!(matches!(
        MhaBackend::new(c, Device::Cpu),
        Err(BackendError::TopkUnsupported(2))
    ));
    if !kernel_rt::gpu_available() {
        // No GPU: cuda:N is a typed error (never a silent CPU fallback), Auto is the CPU.
        assert!(matches!(
            MhaBackend::new(dense_config(), Device::Cuda(0)),
            Err(BackendError::Kernel(kernel_rt::KernelError::NoGpu(_)))
        ));
        let auto = MhaBackend::new(dense_config(), Device::Auto).unwrap();
        assert_eq!(auto.executor_kind().to_string(), "cpu");
        // Graphs need the CUDA executor.
        let mut cpu = MhaBackend::new(dense_config(), Device::Cpu).unwrap();
        assert!(matches!(
            cpu.init_cuda_graph_state(8, 8),
            Err(BackendError::GraphUnsupported(_))
        ));
    }
    let bad: [Mutation; 11] = [
        ("decode_cp_ranks", |c| c.decode_cp_ranks = 0),
        ("decode_cp_ranks", |c| {
            c.decode_cp_ranks = mha_backend::MAX_DECODE_CP_RANKS + 1
        }),
        ("layers", |c| c.layers[0].num_kv_heads = 3),
        ("layers", |c| c.layers[0].head_dim = 80),
        ("layers", |c| c.layers[0].sinks = Some(vec![0.0])),
        ("layers", |c| c.layers.clear()),
        ("page_size", |c| c.page_size = 0),
        ("kv_dtype", |c| c.kv_dtype = KvCacheDtype::F16),
        ("num_swa_pages", |c| c.num_swa_pages = Some(8)),
        ("workspace_bytes", |c| c.workspace_bytes = Some(0)),
        ("spec.num_draft_tokens", |c| {
            c.spec = Some(SpecConfig {
                num_steps: 2,
                num_draft_tokens: 0,
                topk: 0,
            })
        }),
    ];
    for (field, f) in bad {
        let mut c = dense_config();
        f(&mut c);
        match MhaBackend::new(c, Device::Cpu) {
            Err(BackendError::Config { field: got, .. }) => assert_eq!(got, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda(3));
    assert_eq!("CPU".parse::<Device>().unwrap(), Device::Cpu);
    assert!(matches!(
        "gpu".parse::<Device>(),
        Err(BackendError::InvalidDevice(_))
    ));
}

#[test]
fn workspace_rule() {
    use mha_backend::resolve_workspace_bytes;
    assert_eq!(resolve_workspace_bytes(None, None).unwrap(), 536_870_912);
    assert_eq!(
        resolve_workspace_bytes(None, Some("1048576")).unwrap(),
        1 << 20
    );
    assert_eq!(resolve_workspace_bytes(Some(77), Some("5")).unwrap(), 77);
    assert!(resolve_workspace_bytes(None, Some("lots")).is_err());
}

#[test]
fn decode_split_rule() {
    use mha_backend::{resolve_decode_split, SplitMode, DEFAULT_DECODE_SPLIT};
    assert_eq!(resolve_decode_split(None).unwrap(), DEFAULT_DECODE_SPLIT);
    assert_eq!(
        resolve_decode_split(Some(" AUTO ")).unwrap(),
        SplitMode::Auto
    );
    assert_eq!(
        resolve_decode_split(Some("2048:8")).unwrap(),
        SplitMode::Chunked {
            chunk_tokens: 2048,
            max_splits: 8
        }
    );
    for bad in ["", "1024", "0:4", "1024:0", "x:4", "1024:4:2", "1024:2000"] {
        let e = resolve_decode_split(Some(bad)).unwrap_err().to_string();
        assert!(e.contains("MHA_KIT_DECODE_SPLIT"), "{bad}: {e}");
    }
}

#[test]
fn mixed_overlap_rule() {
    use mha_backend::{resolve_mixed_overlap, MixedOverlap, DEFAULT_MIXED_OVERLAP};
    assert_eq!(resolve_mixed_overlap(None).unwrap(), DEFAULT_MIXED_OVERLAP);
    assert_eq!(
        resolve_mixed_overlap(Some("on")).unwrap(),
        DEFAULT_MIXED_OVERLAP
    );
    assert_eq!(
        resolve_mixed_overlap(Some(" OFF ")).unwrap(),
        MixedOverlap::Off
    );
    assert_eq!(resolve_mixed_overlap(Some("0")).unwrap(), MixedOverlap::Off);
    assert_eq!(
        resolve_mixed_overlap(Some("Decode-First")).unwrap(),
        MixedOverlap::DecodeFirst
    );
    assert_eq!(
        resolve_mixed_overlap(Some("context-first")).unwrap(),
        MixedOverlap::ContextFirst
    );
    for bad in ["", "yes", "decode", "context_first", "2"] {
        let e = resolve_mixed_overlap(Some(bad)).unwrap_err().to_string();
        assert!(e.contains("MHA_KIT_MIXED_OVERLAP"), "{bad}: {e}");
    }
}

#[test]
fn skip_softmax_rule() {
    use mha_backend::resolve_skip_softmax;
    assert_eq!(resolve_skip_softmax(None, None).unwrap(), None);
    assert_eq!(resolve_skip_softmax(Some(0.5), None).unwrap(), Some(0.5));
    // The variable overrides the config, `off` clears it.
    assert_eq!(
        resolve_skip_softmax(None, Some(" 0.25 ")).unwrap(),
        Some(0.25)
    );
    assert_eq!(resolve_skip_softmax(Some(0.5), Some("OFF")).unwrap(), None);
    assert_eq!(
        resolve_skip_softmax(Some(0.5), Some("0")).unwrap(),
        Some(0.0)
    );
    for bad in ["", "x", "-1", "nan", "inf"] {
        let e = resolve_skip_softmax(None, Some(bad))
            .unwrap_err()
            .to_string();
        assert!(e.contains("skip_softmax"), "{bad}: {e}");
    }
    assert!(resolve_skip_softmax(Some(-0.5), None).is_err());
}

/// The CPU executor runs one launch at a time: it stays `Off` whatever is
/// asked.
#[test]
fn mixed_overlap_is_off_on_the_cpu() {
    use mha_backend::MixedOverlap;
    let mut b = MhaBackend::new(dense_config(), Device::Cpu).unwrap();
    for o in [
        MixedOverlap::DecodeFirst,
        MixedOverlap::ContextFirst,
        MixedOverlap::Off,
    ] {
        assert_eq!(b.set_mixed_overlap(o).unwrap(), MixedOverlap::Off);
    }
}

#[test]
fn batch_errors_are_typed_and_keep_metadata() {
    let (mut b, r) = backend_with_requests(2);
    let loc = b.alloc_tokens(&[(r[0], 3)]).unwrap();
    let good = ForwardBatch::extend(vec![r[0] as i64], vec![0], vec![3], loc.clone(), false);
    b.init_forward_metadata(&good).unwrap();
    let bads = [
        ForwardBatch {
            batch_size: 2,
            ..good.clone()
        },
        ForwardBatch::decode(vec![r[0] as i64], vec![3], vec![]),
        ForwardBatch::decode(vec![99], vec![3], vec![loc[0]]),
        ForwardBatch::target_verify(vec![r[0] as i64], vec![0], loc.clone(), Some(vec![1, 2])),
        ForwardBatch::target_verify(
            vec![r[0] as i64, r[1] as i64],
            vec![0, 0],
            loc.clone(),
            None,
        ),
        ForwardBatch::target_verify(vec![r[0] as i64], vec![0], vec![0; 17], None),
        ForwardBatch {
            extend_seq_lens: Some(vec![1, 2]),
            ..ForwardBatch::draft_extend_v2(vec![1, 2], vec![3, 3], vec![0; 3], 1)
        },
        ForwardBatch::decode(vec![r[0] as i64], vec![1000], vec![0]),
    ];
    for bad in &bads {
        assert!(
            matches!(
                b.init_forward_metadata(bad),
                Err(BackendError::Batch { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(b.metadata().unwrap().matches(&good));
    // forward with another batch than the metadata's, or wrong sizes.
    let q = vec![0u16; 3 * 256];
    let other = ForwardBatch::decode(vec![r[0] as i64], vec![3], vec![loc[2]]);
    assert!(matches!(
        b.forward(0, TensorRef::Host(&q), None, None, &other, false),
        Err(BackendError::Metadata(_))
    ));
    assert!(matches!(
        b.forward(0, TensorRef::Host(&q[1..]), None, None, &good, false),
        Err(BackendError::Kernel(_))
    ));
    assert!(matches!(
        b.forward(5, TensorRef::Host(&q), None, None, &good, false),
        Err(BackendError::UnknownLayer { .. })
    ));
    let out = b
        .forward(0, TensorRef::Host(&q), None, None, &good, false)
        .unwrap();
    assert!(matches!(out, Tensor::Host(ref v) if v.len() == 3 * 256));
}

#[test]
fn multi_step_draft_backend() {
    // Edge case 9: S = 4 → 3 step backends, offsets 1, 2, 3.
    let mut c = hybrid_config();
    c.spec = Some(SpecConfig {
        num_steps: 4,
        num_draft_tokens: 4,
        topk: 0,
    });
    let mut d = MultiStepDraftBackend::new(c, Device::Cpu).unwrap();
    assert_eq!(d.steps().len(), 3);
    let r = d.steps()[0].alloc_request().unwrap();
    let loc = d.steps()[0].alloc_tokens(&[(r, 8)]).unwrap();
    // Shared state: every step sees the same pools.
    assert_eq!(d.steps()[2].with_pools(|p| p.request_len(r).unwrap()), 8);
    let batch = ForwardBatch::draft_decode(vec![r as i64], vec![5], vec![loc[5]], None);
    d.init_forward_metadata(&batch).unwrap();
    for (i, s) in d.steps().iter().enumerate() {
        assert_eq!(s.speculative_step_id(), i as u32);
        let m = s.metadata().unwrap();
        assert_eq!(m.mode, AttnMode::DraftDecode { step: i as u32 });
        assert_eq!(m.cache_seqlens, vec![6 + i as i32]);
    }
    // Per-step write slots differ from the metadata's: SWA layers translate live.
    for i in 0..3 {
        let step_batch = ForwardBatch {
            out_cache_loc: vec![loc[5 + i]],
            ..batch.clone()
        };
        let s = d.step_mut(i).unwrap();
        let q = vec![bf16(0.5); 256];
        let kv = vec![bf16(1.0 + i as f64); 128];
        s.forward(
            1,
            TensorRef::Host(&q),
            Some(TensorRef::Host(&kv)),
            Some(TensorRef::Host(&kv)),
            &step_batch,
            true,
        )
        .unwrap();
    }
    let KvSnapshot::Half { k, .. } = d.steps()[0].read_kv_cache(1).unwrap() else {
        panic!()
    };
    let swa_slot = d.steps()[0].with_pools(|p| p.swa_mapping().unwrap().map()[loc[7] as usize]);
    assert_eq!(k[swa_slot as usize * 128], bf16(3.0));
    let not_draft = ForwardBatch::decode(vec![r as i64], vec![5], vec![loc[5]]);
    assert!(d.init_forward_metadata(&not_draft).is_err());
}

#[test]
fn eager_metadata_matches_graph_reference() {
    use graph_metadata::reference::{update_graph_metadata, HostInputs, HostOutputs};
    use graph_metadata::GraphMode;
    // Hybrid pool, a few requests, every graph mode on a padded bucket.
    let mut sim = Sim::checked(hybrid_config(), 11);
    let reqs = sim.prefill([10, 4, 17]);
    let rpi: Vec<i64> = reqs.iter().map(|&r| r as i64).collect();
    let seq: Vec<i64> = reqs.iter().map(|&r| sim.len(r) as i64).collect();
    let loc = sim
        .backend
        .alloc_tokens(&[(reqs[0], 2), (reqs[1], 2), (reqs[2], 2)])
        .unwrap();
    let cases: Vec<(ForwardBatch, GraphMode, Option<Vec<i32>>)> = vec![
        (
            ForwardBatch::decode(rpi.clone(), seq.clone(), loc[..3].to_vec()),
            GraphMode::Decode,
            None,
        ),
        (
            ForwardBatch::draft_decode(rpi.clone(), seq.clone(), loc[..3].to_vec(), Some(1)),
            GraphMode::DraftDecode { step: 1 },
            None,
        ),
        (
            ForwardBatch::target_verify(rpi.clone(), seq.clone(), loc.clone(), None),
            GraphMode::TargetVerify { q_len: 2 },
            None,
        ),
        (
            ForwardBatch::draft_extend_v2(rpi.clone(), seq.clone(), loc.clone(), 2),
            GraphMode::DraftExtendV2 { q_len: 2 },
            None,
        ),
        (
            ForwardBatch::target_verify(
                rpi.clone(),
                seq.clone(),
                loc[..5].to_vec(),
                Some(vec![2, 1, 2]),
            ),
            GraphMode::RaggedVerify { max_q_len: 3 },
            Some(vec![]),
        ),
    ];
    let bucket = 4;
    for (batch, mode, ragged) in cases {
        let tokens = match mode {
            GraphMode::RaggedVerify { .. } => 6,
            m => m.num_tokens(bucket),
        };
        let padded = batch.pad_to_bucket(bucket, tokens, 3).unwrap();
        let m = sim.backend.init_forward_metadata(&padded).unwrap().clone();
        let pools = sim.backend.pools_snapshot();
        let qlens = ragged.map(|_| padded.verify_lens().unwrap().to_vec());
        let input = HostInputs {
            mode,
            req_pool_indices: &padded.req_pool_indices,
            seq_lens: &padded.seq_lens,
            req_to_token: pools.req_to_token(),
            req_to_token_rows: pools.req_to_token_rows(),
            req_to_token_width: pools.req_to_token_width(),
            req_to_token_stride: pools.req_to_token_width(),
            page_size: 4,
            pool_slots: Some(pools.full_slots()),
            swa_mapping: Some(pools.swa_mapping().unwrap().map()),
            out_cache_loc: Some(&padded.out_cache_loc),
            qlens: qlens.as_deref(),
        };
        let mut out = HostOutputs::filled(bucket, m.max_num_pages, true, true, Some(tokens), 0);
        assert!(update_graph_metadata(&input, &mut out).is_clean());
        assert_eq!(out.cache_seqlens, m.cache_seqlens, "{mode:?}");
        assert_eq!(out.cu_seqlens_k, m.cu_seqlens_k, "{mode:?}");
        assert_eq!(
            out.cu_seqlens_q.as_ref().unwrap(),
            &m.cu_seqlens_q,
            "{mode:?}"
        );
        assert_eq!(
            out.swa_out_cache_loc.as_ref(),
            m.swa_out_cache_loc.as_ref(),
            "{mode:?}"
        );
        for row in 0..bucket {
            let n = m.page_row(row, 4).len();
            assert_eq!(
                out.page_row(row, n),
                m.page_row(row, 4),
                "{mode:?} row {row}"
            );
            assert_eq!(
                Some(out.swa_page_row(row, n)),
                m.swa_page_row(row, 4),
                "{mode:?} row {row}"
            );
        }
    }
    assert_eq!(ForwardMode::TargetVerify as u8, 5);
    assert!(matches!(
        ForwardBatch::draft_decode(vec![], vec![], vec![], None).spec_info,
        Some(SpecInfo::Draft { step: None })
    ));
}

/// `reference_metadata` is the CPU executor's own metadata of the batch
/// (page tables included), and stores nothing.
#[test]
fn reference_metadata_is_the_host_build() {
    let (mut b, r) = backend_with_requests(2);
    let loc = b.alloc_tokens(&[(r[0], 6), (r[1], 3)]).unwrap();
    let batch = ForwardBatch::extend(
        vec![r[0] as i64, r[1] as i64],
        vec![0, 0],
        vec![6, 3],
        loc,
        false,
    );
    let reference = b.reference_metadata(&batch).unwrap();
    assert!(b.metadata().is_none(), "reference_metadata must not store");
    let m = b.init_forward_metadata(&batch).unwrap().clone();
    assert!(m.tables_on_host && reference.tables_on_host);
    assert_eq!(reference.page_table, m.page_table);
    assert_eq!(reference.cache_seqlens, m.cache_seqlens);
    assert_eq!(reference.cu_seqlens_q, m.cu_seqlens_q);
    assert_eq!(reference.page_row(0, 4), m.page_row(0, 4));
    assert_eq!(m.page_row(0, 4).len(), 2);
}

/// Truncating a request below what its SWA eviction keeps (window 5, P = 4:
/// evicting at 13 tokens frees the SWA pages of positions 0..8) is a typed
/// error that changes nothing: the next token would attend to evicted keys
/// and read the padding page instead (a silent wrong answer before). The
/// committed length, and anything at or above eviction point + window,
/// truncates; freeing always works.
#[test]
fn truncating_below_the_swa_eviction_point_is_refused() {
    let mut c = hybrid_config();
    c.num_pages = 12;
    c.num_swa_pages = Some(12);
    let mut sim = Sim::checked(c, 9);
    let [a] = sim.prefill([13]);
    assert_eq!(sim.backend.evict_swa(a, 13).unwrap(), 2);
    sim.backend.alloc_tokens(&[(a, 3)]).unwrap(); // three draft tokens: 16
    let before = sim.backend.pools_snapshot();
    for bad in [6, 8, 12] {
        let e = sim.backend.truncate_request(a, bad).unwrap_err();
        assert!(
            matches!(e, BackendError::Batch { .. }) && e.to_string().contains("evicted"),
            "{bad}: {e}"
        );
        assert_eq!(sim.backend.pools_snapshot(), before, "{bad}: changed state");
    }
    // Rejecting the drafts back to the committed 13 tokens works, and the
    // request decodes on.
    sim.backend.truncate_request(a, 13).unwrap();
    sim.decode(&[a]);
    sim.backend.free_request(a).unwrap();
}
