// mha-kit kernel family: paged-KV attention, context / prefill / chunked
// prefill ("extend") on Hopper (compute_90a: wgmma, setmaxnreg, mbarrier).
// Same semantics, params, device checks and error word as the compute_90
// kernel (paged_attention_context.cu); design: docs/DESIGN.md "The sm_90a
// context kernel".
//
// Work item = (q tile of BM packed (token, head) rows, KV split s,
// KV head h, request b), numbered with q tiles fastest (items in flight
// share K/V in L2), the heaviest tiles of a (request, head) first. The grid
// is persistent (every entry but e4m3 D 256, which runs one CTA per item):
// CTA c starts with item c and takes further items from a device counter
// (p.work, fetched one item ahead, reset by the last CTA to run out); the
// K/V rings run on across a CTA's items and its Q buffers take the items in
// turn (Cfg::QBUF: three at 16-bit D 128, one at D 256). With split KV
// (p.kv_splits > 1) an item covers one chunk of the q tile's KV tiles and
// writes partial rows; the merge entry at the end of this file finishes them.
// BM = 64 rows per consumer warpgroup: two consumers (BM 128, 384 threads),
// three at D 64 with 16-bit K/V (BM 192, 512 threads; see Cfg::NCW).
// Warpgroups:
//  * producer (warpgroup 0, setmaxnreg 56; 48 at D 256): loads each item's
//    Q tile into a free Q buffer (TMA boxes issued by thread 0 where G
//    divides BM, p.q_tma; cp.async by all 128 threads otherwise), then fills a K ring and a V ring (2-3
//    slots each; V one tile behind K), each slot guarded by a full and an
//    empty mbarrier: by gathering the tile's keys page by page with 16-byte
//    cp.async (default) or with TMA boxes (one thread, ContextKvLoad::Tma).
//    In the gather eight lanes share a 128-byte line of a key row (a warp
//    copy writes four whole lines: the fewest shared-memory wavefronts); lane
//    l of warp w looks up the page of key row key_row_of_lane(w, l) one tile
//    ahead and shares the row address by shuffle; the valid-key mask (one
//    ballot word per producer warp) goes to the consumers through shared
//    memory. Keys outside the tile's needed range [k_lo, k_hi) or on bad
//    pages are zero-filled and masked (TMA: whole pages are read, keys past
//    the range masked). e4m3 K/V (F8; setmaxnreg 72 / 216 at D 64 / 128):
//    the same gather lands 8-bit tiles in a staging ring; each producer
//    thread converts the chunks it copied to f16 into the 16-bit ring slot
//    (fence.proxy.async, then the full barrier); both GEMMs then run in f16
//    (a bf16 Q tile converted once per item with a power-of-two shift per
//    row, see QCONV). At D 128 with a bf16 Q (K8) only V is staged and
//    converted: K's rows go straight into 8-bit K ring slots and S runs as
//    e4m3 GEMMs on them, Q split into two e4m3 parts (see K8).
//  * two consumers (warpgroups 1-2, setmaxnreg 224; three of 152 at D 64
//    16-bit), 64 rows each: S = Q K^T
//    with wgmma (both operands in shared memory, 128-byte swizzle), online
//    softmax in f32 registers (exp2, scale_log2 = bmm1_scale log2 e), O += P
//    V with wgmma (P from registers, V transposed from shared memory). Per
//    tile t: issue S_t, issue P_{t-1} V_{t-1}, wait for S_t, softmax of S_t
//    under the running P V (max, one FFMA + ex2 per score, f32 row sums),
//    wait, rescale O and pack P_t to 16 bits (ping-pong between the
//    consumers is a measured variant, off by default). With three consumers
//    (SERIAL) each runs S_t, softmax, P_t V_t one after the other, P packed
//    into the S registers, and the other two fill the tensor cores. Sinks
//    join once at the end; rows that see no key output zeros. Each
//    warpgroup stages its output rows in its rows of the item's Q buffer;
//    one thread writes them as TMA stores (p.o_tma, two consumers) or the
//    warpgroup stores them as 16-byte row chunks.
// A key masked for a row never reaches it: masked logits are selected to
// -inf (never multiplied), and on tiles that carry masked keys the V rows
// some row of the warpgroup does not see are scanned for non-finite values;
// when one is present that tile's P V runs as a scalar loop that skips zero
// weights (0 * NaN would poison the row).
//
// Shared memory layout: every operand tile is stored as 64-column blocks
// ("atoms") of rows x 128 bytes, 16-byte chunk c of row r at
// ((c ^ (r & 7)) * 16): the wgmma 128-byte swizzle.
#include "context_common.cuh"
#include "wgmma_sm90.cuh"

namespace pas {

using namespace pac;

// F8: e4m3 K/V pools (Q and the operand tiles stay 16-bit; see the
// producer's e4m3 gather).
// SWAP (timing experiment XV & 16, D 128 16-bit only): ring depths K 3 /
// V 2 instead of the default 2 / 3 (same shared memory).
// DUO (D 64 / 128, 16-bit K/V; the launcher's choice for short KV ranges,
// see `context_sm90_duo_wanted` in src/context/sm90.rs): two CTAs per SM, each a
// producer and ONE consumer warpgroup of 64 rows over 64-key tiles. The two
// CTAs of an SM run their items independently, so one CTA's item start,
// first softmax and epilogue (CUDA-core work with no GEMM of its own to
// hide under) overlap the other CTA's GEMMs; the smaller tiles also compute
// fewer masked scores on the causal diagonal. Each CTA reads the K/V of its
// 64 rows, twice the bytes per FLOP of the 128-row items: for short KV
// ranges only.
// K8 (e4m3 K/V at D 128 with a bf16 Q, see context_sm90_body): the K ring
// holds the e4m3 tiles as copied (BN x D bytes a slot), which leaves room
// for two Q buffers; the staging ring holds V only.
template <int D, bool F8 = false, bool SWAP = false, bool DUO = false, bool K8 = false>
struct Cfg {
    static_assert(!DUO || (!F8 && !SWAP && D != 256), "two CTAs per SM: D 64 / 128, 16-bit K/V");
    static_assert(!K8 || (F8 && D == 128 && !DUO && !SWAP), "K8: e4m3 K/V at D 128");
    static constexpr int CTAS = DUO ? 2 : 1;        // CTAs resident per SM (launch bounds)
    static constexpr int BN = D == 256 || DUO ? 64 : 128;  // keys per KV tile
    // Consumer warpgroups, 64 query rows each: three at D 64 with 16-bit
    // K/V (192-row tiles, as FA3 runs D 64: there the exponentials take as
    // long as both GEMMs, and a third consumer warp per scheduler keeps the
    // MUFU and the tensor cores busy while one warp waits), else two.
    static constexpr int NCW = DUO ? 1 : D == 64 && !F8 ? 3 : 2;
    static constexpr int BM = 64 * NCW;               // packed query rows per work item
    static constexpr int NTHREADS = 128 * (NCW + 1);  // producer + consumers
    // Registers a thread gets at launch (one CTA per SM), which setmaxnreg
    // then moves between the roles: 168 at 384 threads, 128 at 512.
    // Two CTAs per SM (DUO, 256 threads each): 128.
    static constexpr int LAUNCH_REGS = (65536 / (NTHREADS * CTAS)) & ~7;
    // Register split (128 x P + 128 NCW x C <= the launch's LAUNCH_REGS x
    // NTHREADS). D 256: 56 / 224 (the persistent 16-bit producer spilled at
    // 40 and 48; at 40 / 232 it spilled 60 bytes).
    // e4m3: 72 / 216 at D 64 / 128, 56 / 224 at D 256 (the producer's
    // conversion keeps four 16-byte loads in flight; with fewer registers
    // it spilled).
    // Three consumers (D 64 16-bit): 56 / 152, the whole register file.
    // DUO: 56 / 200 (one consumer of 64 rows: O 64, S 32, P 16 registers at D 128).
    static constexpr int PRODUCER_REGS = D == 256 ? 56 : F8 ? 72 : 56;
    static constexpr int CONSUMER_REGS = DUO ? 200 : NCW == 3 ? 152 : F8 && D != 256 ? 216 : 224;
    static_assert(128 * PRODUCER_REGS + 128 * NCW * CONSUMER_REGS <= NTHREADS * LAUNCH_REGS, "register split");
    // Persistent grid (mirrored by `context_sm90_persistent` in
    // src/context/sm90.rs): every 16-bit entry; D 256 with one Q buffer (Q
    // [128, 256] is 64 KB), released once the item's staged output rows
    // have been read by their TMA stores (see STAGE_O; measured 2-5% faster
    // than one CTA per item on the short cells, PERF.md session 53). e4m3
    // at D 256 runs one CTA per work item: its persistent producer (56 or
    // 64 registers) spilled 12-24 bytes of item-loop state.
    static constexpr bool PERSISTENT = D != 256 || !F8;
    static constexpr int CPR = D / 8;               // 16-byte chunks per row
    static constexpr int Q_ATOM = BM * 128;         // bytes of one 64-column block of Q
    static constexpr int KV_ATOM = BN * 128;
    static constexpr int Q_BYTES = BM * D * 2;
    static constexpr int KV_BYTES = BN * D * 2;     // one K or V tile
    static constexpr int K_BYTES = K8 ? BN * D : KV_BYTES;  // one K ring slot
    // Q buffers: two on the persistent grid (the next item's Q loads while
    // the consumers finish the current one), three at D 128 16-bit (Q3, in
    // the room of the V ring's third slot: with the output staged in the Q
    // buffer a buffer frees only after its item's TMA stores have read it),
    // one at D 256 (64 KB each). e4m3 at D 128: one, so that the staging
    // ring fits (K8: two, see KST).
    static constexpr bool Q3 = D == 128 && !F8 && !DUO && !SWAP;
    static constexpr int QBUF = K8 ? 2 : PERSISTENT && !(F8 && D == 128) && D != 256 ? (Q3 ? 3 : 2) : 1;
    // The epilogue stages each warpgroup's output rows in its rows of the
    // item's Q buffer and writes them as whole 16-byte chunks (coalesced
    // rows); the Q buffer is then released after the epilogue, not after the
    // item's last S. Not with one Q buffer on the persistent grid for f16-Q
    // e4m3 at D 128: the next item's Q would wait for this item's epilogue.
    // 16-bit D 256 (persistent, one Q buffer) stages all the same: its
    // thread-stored epilogue measured 2-3% slower than one CTA per item
    // with staging (PERF.md session 52), the staged one 2-5% faster on the
    // short cells (session 53); the next item's Q then waits for this
    // item's TMA stores to have read the staged rows (no deferral).
    static constexpr bool STAGE_O = QBUF >= 2 || !PERSISTENT || (D == 256 && !F8);
    static constexpr int Q_OFF = 0;
    static constexpr int K_OFF = Q_OFF + QBUF * Q_BYTES;  // KST slots
    // Ring depths. The producer issues K_t and then V_{t-1}; V's slot frees
    // one iteration after K's (P_{t-1} V_{t-1} runs beside S_t), so with
    // V 2 deep V was issued only one iteration ahead of its use. At D 128
    // 16-bit, K 2 / V 3 measured 504 vs 471 TFLOP/s at bs 8 x 4096 and 2-4%
    // fewer cycles per item from 4 x 4096 up, ~1% more at bs 32 x 512
    // (H200, session 6; the split of session 5 and before was K 3 / V 2).
    // K 2 / V 2 with a third Q buffer (sessions 39-40, H100, in turns with
    // K 2 / V 3 and two Q buffers): +1% at bs 8 x 4096, +3% at bs 1 x 16384,
    // the short cells the same.
    static constexpr bool D128_16 = D == 128 && !F8;
    // DUO: 2 / 2 at D 128 (two CTAs' shared memory must fit one SM), 3 / 3 at D 64.
    // K8: four K slots of 16 KB (the producer's wait for a free K slot is
    // then for the S of three tiles back, never on the path of the V
    // conversion the consumers wait for next).
    static constexpr int KST = K8 ? 4 : DUO ? (D == 64 ? 3 : 2) : D128_16 ? (SWAP ? 3 : 2) : D == 256 || (F8 && D == 128) ? 2 : 3;
    static constexpr int VST = DUO ? (D == 64 ? 3 : 2) : D128_16 ? (Q3 || SWAP ? 2 : 3) : D == 64 ? 3 : 2;
    static_assert(!SWAP || (D == 128 && !F8), "ring swap: D 128 16-bit only");
    static constexpr int V_OFF = K_OFF + KST * K_BYTES;
    // Valid-key masks, u32 [KST][4]: one word per producer warp (see `key_bit`).
    static constexpr int VMW = 4;
    // e4m3 staging ring: SST steps of one 8-bit K tile and one 8-bit V tile
    // (the cp.async gather lands there; the producer converts them into the
    // rings). Two steps (copies one step ahead of the conversion) where
    // shared memory allows, one at D 256; none for 16-bit K/V.
    static constexpr int SST = !F8 ? 0 : D == 256 ? 1 : 2;
    static constexpr int F8_BYTES = BN * D;         // one 8-bit K or V tile
    static constexpr int STG_OFF = V_OFF + VST * KV_BYTES;
    static constexpr int VM_OFF = STG_OFF + SST * (K8 ? 1 : 2) * F8_BYTES;
    static constexpr int BAR_OFF = VM_OFF + KST * VMW * 4;
    // Q full/empty; K full/empty; V full/empty; work-item slots full/empty;
    // work-item geometry published; e4m3: Q's TMA boxes landed (before the
    // producer converts them).
    static constexpr int NBAR = 2 * QBUF + 2 * KST + 2 * VST + 6 + (F8 ? QBUF : 0);
    // One f32 per consumer thread: the per-tile store that keeps the
    // exponentials ahead of the wait for P V (see `softmax`).
    static constexpr int PIN_OFF = BAR_OFF + NBAR * 8;
    // i32 [4]: two work-item slots, thread 0's prefetched counter value, a
    // spare (8-byte multiple; at D 256 the consumers' shared pin word,
    // see pin_addr); then the two slots' geometry (`Item`,
    // published by producer warp 0 for the consumers).
    static constexpr int ITEM_OFF = PIN_OFF + 128 * NCW * 4;
    static constexpr int ITEM_GEOM_BYTES = 64;  // >= sizeof(Item), checked below
    // e4m3 K/V: u8 [QBUF][BM], each Q row's shift qs (see the bf16 Q conversion, QCONV).
    // u64: the generic address of the `out` tensor map parameter, read by
    // the thread that issues a TMA store where it does (NVRTC otherwise takes
    // a parameter's address once, at the kernel's start, and a register
    // holds it across the item loop).
    static constexpr int OMAP_OFF = ITEM_OFF + 4 * 4 + 2 * ITEM_GEOM_BYTES;
    // u64: the generic address of the `q` tensor map parameter (TMA loads of
    // Q, p.q_tma), read by producer thread 0 where it issues them.
    static constexpr int QMAP_OFF = OMAP_OFF + 8;
    static constexpr int QX_OFF = QMAP_OFF + 8;
    static constexpr int QX_BYTES = F8 ? QBUF * BM : 0;
    static constexpr int BYTES = QX_OFF + QX_BYTES;
    static constexpr int ALLOC = BYTES + 1024;  // slack: the base is rounded up to 1024
    static_assert(BAR_OFF % 8 == 0, "mbarrier alignment");
    static_assert((BN * CPR) % 128 == 0 && (BM * CPR) % 128 == 0, "producer split");
    static_assert(ALLOC <= 227 * 1024, "shared memory of one CTA");
    // 228 KB a SM, 1 KB of it reserved per resident CTA.
    static_assert(CTAS * (ALLOC + 1024) <= 228 * 1024, "shared memory of the CTAs of one SM");
};

// ---- mbarrier, named barrier, wgmma and register-budget helpers ----------------
MHA_KIT_DEVICE void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
MHA_KIT_DEVICE void mbar_arrive(u32 bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Arrives on `bar` when `on` (predicated in PTX: no branch, see named_sync_if).
MHA_KIT_DEVICE void mbar_arrive_if(bool on, u32 bar) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.u32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
        "r"((u32)on)
        : "memory");
}
// Arrives on `bar` and adds `bytes` to the transaction count it waits for
// (the bytes of the TMA copies that complete on it).
MHA_KIT_DEVICE void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Arrives on `bar` once every cp.async this thread issued so far has landed.
MHA_KIT_DEVICE void mbar_arrive_cp_async(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
MHA_KIT_DEVICE void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred P1;\nLAB_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// 2^x with subnormal results flushed to zero (one MUFU.EX2; without .ftz
// ptxas wraps each in a range test and two multiplies), volatile so that it
// stays in program order with the wgmma waits. A weight below 2^-126 of the
// row max becomes 0.
MHA_KIT_DEVICE float ex2f(float x) {
    float y;
    asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// 2^x for x <= 0 on the FMA pipe (no MUFU): x = j + f, j = round(x) (the
// 1.5 * 2^23 shift), f in [-1/2, 1/2], 2^f by a degree-3 minimax polynomial
// (max relative error 1.0e-4 in f32, below the 16-bit rounding of P) and j
// added to the exponent field. Results below 2^-126 are 0, as ex2.approx.ftz
// gives (so x = -inf, a masked score, is exactly 0); NaN stays NaN (the
// clamp is a compare-select, which keeps NaN, and NaN bits + anything << 23
// from a NaN shift stay NaN).
MHA_KIT_DEVICE float ex2_poly(float x) {
    const float xc = x < -127.f ? -127.f : x;
    const float t = xc + 12582912.f;
    const float f = xc - (t - 12582912.f);
    const float p = fmaf(fmaf(fmaf(0.05500855f, f, 0.24221028f), f, 0.6932829f), f, 1.f);
    const u32 r = __float_as_uint(p) + (__float_as_uint(t) << 23);
    return x <= -126.f ? 0.f : __uint_as_float(r);
}
// A CUtensorMap (driver-encoded, 128 bytes, 64-byte aligned), passed by value
// as a __grid_constant__ kernel parameter.
struct alignas(64) TmaMap {
    unsigned long long opaque[16];
};
// TMA: the 4-D box at coordinates c0..c3 of tensor map `map` into shared
// memory at `dst`, completing `bytes` of `bar`'s transaction count. Boxes
// (partly) outside the tensor are zero-filled and still count in full.
MHA_KIT_DEVICE void tma_load_4d(u32 dst, const TmaMap& map, u32 bar, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5}], [%6];\n" ::"r"(dst),
        "l"(reinterpret_cast<u64>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}
// TMA: the 3-D box at coordinates c0..c2 of the tensor map at generic
// address `map` (a kernel parameter's) into shared memory at `dst`,
// completing its bytes on `bar`'s transaction count (zero-filled outside the
// tensor, counted in full).
MHA_KIT_DEVICE void tma_load_3d(u32 dst, u64 map, u32 bar, int c0, int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
        "%4}], [%5];\n" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
// TMA store, issued when `on` (predicated in PTX): the 3-D box at
// coordinates c0..c2 of the tensor map at generic address `map` (a kernel
// parameter's) from shared memory at `src`, completing in this thread's
// bulk async-group (see bulk_commit_if). Parts of the box outside
// the tensor are not written.
MHA_KIT_DEVICE void tma_store_3d_if(bool on, u64 map, u32 src, int c0, int c1, int c2) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.u32 p, %5, 0;\n"
        "@p cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n}\n" ::"l"(map),
        "r"(c0), "r"(c1), "r"(c2), "r"(src), "r"((u32)on)
        : "memory");
}
// When `on`: closes this thread's bulk async-group (its TMA stores so far).
MHA_KIT_DEVICE void bulk_commit_if(bool on) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.u32 p, %0, 0;\n@p cp.async.bulk.commit_group;\n}\n" ::"r"((u32)on)
                 : "memory");
}
// When `on`: waits until every bulk async-group this thread closed has read
// its shared-memory source (the buffer may then be reused; the global writes
// complete on their own, at the latest with the grid), then arrives on `bar`.
MHA_KIT_DEVICE void bulk_wait_read_arrive_if(bool on, u32 bar) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.u32 p, %0, 0;\n@p cp.async.bulk.wait_group.read 0;\n"
        "@p mbarrier.arrive.shared::cta.b64 _, [%1];\n}\n" ::"r"((u32)on),
        "r"(bar)
        : "memory");
}
// When `on`: waits until every bulk async-group this thread closed is
// complete (its global writes done; before the thread exits).
MHA_KIT_DEVICE void bulk_wait_if(bool on) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.u32 p, %0, 0;\n@p cp.async.bulk.wait_group 0;\n}\n" ::"r"((u32)on)
                 : "memory");
}
// Predicated in PTX (no branch): a branch between a wgmma and its wait makes
// ptxas serialize every wgmma.
MHA_KIT_DEVICE void named_sync_if(bool on, u32 id, u32 count) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.u32 p, %2, 0;\n@p bar.sync %0, %1;\n}\n" ::"r"(id), "r"(count),
                 "r"((u32)on)
                 : "memory");
}
MHA_KIT_DEVICE void named_arrive_if(bool on, u32 id, u32 count) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.u32 p, %2, 0;\n@p bar.arrive %0, %1;\n}\n" ::"r"(id), "r"(count),
                 "r"((u32)on)
                 : "memory");
}
// OR of `v` over the `count` threads meeting at named barrier `id`.
MHA_KIT_DEVICE bool named_or(u32 id, u32 count, bool v) {
    u32 r;
    asm volatile(
        "{\n.reg .pred p, q;\nsetp.ne.u32 q, %1, 0;\nbar.red.or.pred p, %2, %3, q;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(r)
        : "r"((u32)v), "r"(id), "r"(count)
        : "memory");
    return r != 0;
}
MHA_KIT_DEVICE void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
MHA_KIT_DEVICE void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
MHA_KIT_DEVICE void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins accumulator / fragment registers at this point of the program: values
// written by an in-flight wgmma are read only after its wait, and registers an
// in-flight wgmma reads are not reused before it.
template <int N>
MHA_KIT_DEVICE void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
MHA_KIT_DEVICE void fence_regs(u32 (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

// wgmma shared-memory descriptor, 128-byte swizzle (addresses and offsets in bytes).
MHA_KIT_DEVICE constexpr u64 sdesc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) |
           (1ull << 62);
}

// wgmma shared-memory descriptor without swizzle (16-byte aligned operand).
MHA_KIT_DEVICE constexpr u64 sdesc_noswz(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32);
}

// d (+)= A B, both operands in shared memory. INIT: the first step of a
// fresh accumulator (scale-d 0, d write-only: its old values are not read,
// so they need no definition), else d = A B + d.
template <int QT, int N, bool INIT>
MHA_KIT_DEVICE void mma_ss(float (&d)[N / 2], u64 a, u64 b) {
    if constexpr (INIT) {
        if constexpr (QT == 0 && N == 32) wg::wgmma_ss_bf16_n32_init(d, a, b);
        if constexpr (QT == 0 && N == 64) wg::wgmma_ss_bf16_n64_init(d, a, b);
        if constexpr (QT == 0 && N == 128) wg::wgmma_ss_bf16_n128_init(d, a, b);
        if constexpr (QT == 1 && N == 32) wg::wgmma_ss_f16_n32_init(d, a, b);
        if constexpr (QT == 1 && N == 64) wg::wgmma_ss_f16_n64_init(d, a, b);
        if constexpr (QT == 1 && N == 128) wg::wgmma_ss_f16_n128_init(d, a, b);
    } else {
        if constexpr (QT == 0 && N == 32) wg::wgmma_ss_bf16_n32(d, a, b, 1);
        if constexpr (QT == 0 && N == 64) wg::wgmma_ss_bf16_n64(d, a, b, 1);
        if constexpr (QT == 0 && N == 128) wg::wgmma_ss_bf16_n128(d, a, b, 1);
        if constexpr (QT == 1 && N == 32) wg::wgmma_ss_f16_n32(d, a, b, 1);
        if constexpr (QT == 1 && N == 64) wg::wgmma_ss_f16_n64(d, a, b, 1);
        if constexpr (QT == 1 && N == 128) wg::wgmma_ss_f16_n128(d, a, b, 1);
    }
}
// d (+)= A B for e4m3 A and B (m64nNk32, both K-major in shared memory);
// INIT as in mma_ss.
template <int N, bool INIT>
MHA_KIT_DEVICE void mma_ss8(float (&d)[N / 2], u64 a, u64 b) {
    if constexpr (INIT && N == 64) wg::wgmma_ss_e4m3_n64_init(d, a, b);
    if constexpr (INIT && N == 128) wg::wgmma_ss_e4m3_n128_init(d, a, b);
    if constexpr (!INIT && N == 64) wg::wgmma_ss_e4m3_n64(d, a, b, 1);
    if constexpr (!INIT && N == 128) wg::wgmma_ss_e4m3_n128(d, a, b, 1);
}
// One k-step of S = Q K^T into d (m64nNk16, or m64nNk32 for K8's e4m3
// chains); `first`: the tile's first step, write-only (see mma_ss).
template <int QT, int N, bool K8>
MHA_KIT_DEVICE void s_step(float (&d)[N / 2], u64 a, u64 b, bool first) {
    if constexpr (K8) {
        if (first)
            mma_ss8<N, true>(d, a, b);
        else
            mma_ss8<N, false>(d, a, b);
    } else if (first) {
        mma_ss<QT, N, true>(d, a, b);
    } else {
        mma_ss<QT, N, false>(d, a, b);
    }
}
template <int QT, int N>
MHA_KIT_DEVICE void mma_rs(float (&d)[N / 2], const u32 (&a)[4], u64 b, int scale_d) {
    if constexpr (QT == 0 && N == 8) wg::wgmma_rs_bf16_n8(d, a, b, scale_d);
    if constexpr (QT == 1 && N == 8) wg::wgmma_rs_f16_n8(d, a, b, scale_d);
    if constexpr (QT == 0 && N == 64) wg::wgmma_rs_bf16_n64(d, a, b, scale_d);
    if constexpr (QT == 0 && N == 128) wg::wgmma_rs_bf16_n128(d, a, b, scale_d);
    if constexpr (QT == 0 && N == 256) wg::wgmma_rs_bf16_n256(d, a, b, scale_d);
    if constexpr (QT == 1 && N == 64) wg::wgmma_rs_f16_n64(d, a, b, scale_d);
    if constexpr (QT == 1 && N == 128) wg::wgmma_rs_f16_n128(d, a, b, scale_d);
    if constexpr (QT == 1 && N == 256) wg::wgmma_rs_f16_n256(d, a, b, scale_d);
}

// Byte offset of 16-byte chunk `ch` of row `row` in a swizzled tile of `atom` bytes per 64 columns.
MHA_KIT_DEVICE u32 swz(int row, int ch, int atom) {
    return (u32)((ch >> 3) * atom + row * 128 + (((ch & 7) ^ (row & 7)) << 4));
}

// Valid-key mask layout, shared by the producers and the consumers: lane l of
// producer warp w stands for key row 4 w + (l >> 3) + 16 (l & 7) of a KV tile
// (in the gather, the row whose page that lane looks up) and word w of the
// tile's mask is warp w's ballot. At BN 64 lanes with (l & 7) >= 4 stand for
// rows >= BN, which do not exist; their bits are set.
MHA_KIT_DEVICE constexpr int key_row_of_lane(int w, int l) { return 4 * w + (l >> 3) + 16 * (l & 7); }

// `ptr` of lane (l & ~7) | j of the caller's group of eight lanes (a
// shuffle of width 8; every lane calls it): with j a constant the lane is
// an immediate of the SHFL, where `(l & 24) | j` held a register per j.
template <typename T>
MHA_KIT_DEVICE const T* shfl_ptr8(const T* ptr, int j) {
    const u64 v = reinterpret_cast<u64>(ptr);
    const u32 lo = __shfl_sync(0xffffffffu, (u32)v, j, 8);
    const u32 hi = __shfl_sync(0xffffffffu, (u32)(v >> 32), j, 8);
    return reinterpret_cast<const T*>(((u64)hi << 32) | lo);
}

// Four e4m3 bytes -> two packed 16-bit pairs of the Q dtype (exact), as
// pac::e4m3x4_to_half but with the word split into its two halves in PTX
// (ptxas then converts each half in place instead of shifting it first).
template <int QT>
MHA_KIT_DEVICE void e4m3x4_cvt(u32 w, u32& lo, u32& hi) {
    u32 h0, h1;
    asm("{\n.reg .b16 a, b;\nmov.b32 {a, b}, %2;\ncvt.rn.f16x2.e4m3x2 %0, a;\ncvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
        : "=r"(h0), "=r"(h1)
        : "r"(w));
    if constexpr (QT == 1) {
        lo = h0;
        hi = h1;
    } else {
        lo = pack2<0>(f16_to_f32((u16)(h0 & 0xffffu)), f16_to_f32((u16)(h0 >> 16)));
        hi = pack2<0>(f16_to_f32((u16)(h1 & 0xffffu)), f16_to_f32((u16)(h1 >> 16)));
    }
}

// The bits of the largest finite |q| (sign cleared; NaN and infinity, whose
// exponent field is all ones, count as 0) of a row of bf16 q held as one
// 16-byte chunk (4 words, 8 values) by each of the row's CPR consecutive
// lanes: a larger value has larger bits, so the biased exponent is mx >> 7.
template <int CPR>
MHA_KIT_DEVICE u32 bf16_row_absmax(const u32 (&w4)[4]) {
    u32 mx = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const u32 lo = w4[e] & 0x7FFFu, hi = (w4[e] >> 16) & 0x7FFFu;
        mx = max(mx, lo < 0x7F80u ? lo : 0u);
        mx = max(mx, hi < 0x7F80u ? hi : 0u);
    }
#pragma unroll
    for (int o = CPR / 2; o >= 1; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    return mx;
}

// An f16 pair x (element 0 in the low half) -> its e4m3 parts hi = rn(x)
// and lo = rn(x - hi) (each a 16-bit pair, element 0 in the low byte; the
// high 16 bits of hi / lo are zero). x - hi is exact in f16 (hi is within a
// factor 2 of x, or 0). Non-finite x: hi and lo NaN (x + (x - x); e4m3 has no
// infinity, and satfinite would clamp one to 448).
MHA_KIT_DEVICE void e4m3x2_split(u32 x, u32& hi, u32& lo) {
    asm("{\n.reg .b32 z, xs, bk, r;\n.reg .b16 hh, ll;\n"
        "sub.rn.f16x2 z, %2, %2;\n"
        "add.rn.f16x2 xs, %2, z;\n"
        "cvt.rn.satfinite.e4m3x2.f16x2 hh, xs;\n"
        "cvt.rn.f16x2.e4m3x2 bk, hh;\n"
        "sub.rn.f16x2 r, xs, bk;\n"
        "cvt.rn.satfinite.e4m3x2.f16x2 ll, r;\n"
        "cvt.u32.u16 %0, hh;\ncvt.u32.u16 %1, ll;\n}\n"
        : "=r"(hi), "=r"(lo)
        : "r"(x));
}

// Orders this thread's generic-proxy shared-memory stores before later
// async-proxy reads (wgmma operands) of the threads it then signals.
MHA_KIT_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// One work item: q tile `tile` (of BM packed rows) of KV head h of request
// b, and what the tile needs: rows, row positions, key range [k_lo, k_hi)
// and its KV tiles t_first .. t_first + ntiles - 1 (with split KV: chunk
// `split` of them).
struct Item {
    int tile, h, b, split;
    Geom g;
    bool skip;  // bad request (counted) or a tile past the request's rows
    int rows;
    i32 r0, x_base, k_lo, k_hi, t_first;
    int ntiles;
};

static_assert(sizeof(Item) <= Cfg<64>::ITEM_GEOM_BYTES && alignof(Item) <= 8, "published geometry");

template <int BN, int BM>
MHA_KIT_DEVICE void item_ranges(const ContextParams& p, Item& I);

// Item `it` of the grid order (q tiles fastest, the heaviest first; then KV
// splits; then KV heads; then requests), for KV tiles of BN keys.
// Warp-cooperative (every lane of the warp calls it); `report`: this thread
// counts the request's bad cu_seqlens / lengths (once per request: on its
// item of tile 0, head 0, split 0).
template <int BN, int BM>
MHA_KIT_DEVICE Item item_geom(const ContextParams& p, int it, bool report) {
    Item I;
    // 32-bit: the launcher keeps q_tiles * kv_splits * num_kv_heads * bs <= i32::MAX.
    const int x = it % p.q_tiles;
    int rest = it / p.q_tiles;
    I.split = rest % p.kv_splits;
    rest /= p.kv_splits;
    I.tile = p.q_tiles - 1 - x;
    I.h = rest % p.num_kv_heads;
    I.b = rest / p.num_kv_heads;
    const bool first = I.tile == 0 && I.h == 0 && I.split == 0;
    I.g = request_geom_warp(p, I.b, report && first);
    item_ranges<BN, BM>(p, I);
    return I;
}

// The rows, positions and KV range of item I (tile, split and g set).
template <int BN, int BM>
MHA_KIT_DEVICE void item_ranges(const ContextParams& p, Item& I) {
    const i32 rows_total = I.g.n * p.group;
    I.r0 = I.tile * BM;
    I.skip = I.g.skip || I.r0 >= rows_total;
    I.rows = I.skip ? 0 : min(BM, rows_total - I.r0);
    I.x_base = I.g.len - I.g.n;
    const i32 x_min = I.x_base + I.r0 / p.group;
    const i32 x_max = I.x_base + (I.r0 + max(I.rows, 1) - 1) / p.group;
    I.k_hi = max(x_max + 1, 0);
    I.k_lo = p.window_left >= 0 ? max(x_min - p.window_left, 0) : 0;
    I.t_first = I.k_lo / BN;
    I.ntiles = !I.skip && I.k_hi > I.k_lo ? (I.k_hi - 1) / BN - I.t_first + 1 : 0;
    if (p.kv_splits > 1) {
        const int t0 = I.split * p.split_tiles;
        I.t_first += t0;
        I.ntiles = max(0, min(p.split_tiles, I.ntiles - t0));
    }
}

// XV: timing experiments that leave one stage out (wrong results; only the
// bench's `_x{XV}` entries set it): 1 no softmax math, 2 no wgmma, 4 no
// global K/V reads (zero-filled copies); 16 K / V ring depths 3 / 2
// instead of 2 / 3 (correct results); 32 O rescaled under S instead of
// after the wait for P V (correct results, see `rescale_o`); 64 one
// exponential in four by polynomial on the FMA pipe (results within the
// 16-bit rounding of P, see `ex2_poly`); 4096 serial
// consumers whose exponential sections alternate, row sums of the 16-bit
// P (correct results, see SX); 16384 the default overlapped consumers with
// alternating exponential sections, row sums of the 16-bit P (correct
// results, see EXT); 8 trace:
// correct results, and
// thread 0 of each warpgroup writes %clock stamps of its item's phases to
// p.partial (see `TR_*`; the launcher points p.partial at its workspace).
// F8: e4m3 K/V pools.
// Trace layout (XV & 8): u32 [TR_CTAS][TR_ITEMS][3 roles: producer,
// consumer 0, consumer 1][TR_EV], the n-th item a role took in a CTA. Events:
// producer 0 item taken, 1 Q copies (or TMA boxes) issued, 2 / 3 K tile 0 / 1 copies issued
// (the cp.async gather only);
// consumers 0 item taken, 1 geometry, 2 Q landed, 3 K 0 landed, 4 S 0 done,
// 5 softmax 0 done, 6 tile loop done, 7 last V landed, 8 last P V done,
// 9 epilogue done, 10 tile 1's K landed, 11 V 0 landed, 12 ntiles, 13
// item, 14 V 0 scanned, 15 the last V scanned, 16-20 cycles of the fast
// tiles 1.. in: issuing S and P V, waiting for S, softmax, waiting for P V,
// rescale and pack, 21 clock at tile 2's S issue (fast path; the phase of
// the two consumers), 22 the item's set-up done (its Q wait begins), 23
// cycles of tiles 1.. waiting for their K and the previous tile's V (the
// two-consumer loop; summed). Slot [cta][TR_ITEMS - 1][role][TR_EV - 1]
// holds the number of items the role took (stamps of later items are not
// kept).
constexpr int TR_CTAS = 132, TR_ITEMS = 48, TR_EV = 24;
MHA_KIT_DEVICE u32 clk32() {
    u32 c;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c));
    return c;
}

// LSE: the entry writes the row LSE when p.lse is set (the `_lse` entries;
// the others have no LSE code, so that their code stays as measured).
template <int QT, int D, int XV = 0, bool F8 = false, bool DUO = false, bool LSE = false>
MHA_KIT_DEVICE void context_sm90_body(const ContextParams& p, const TmaMap& tmap_k, const TmaMap& tmap_v,
                                      const TmaMap& tmap_o, const TmaMap& tmap_q) {
    // K8 (e4m3 K/V at D 128 with a bf16 Q): S = Q K^T runs on the e4m3 K
    // tile as copied (no conversion of K), as two e4m3 GEMMs into one
    // accumulator: Q = hi + lo, hi = e4m3(q 2^e), lo = e4m3(q 2^e - hi), with
    // the power of two 2^e per row that brings the row's largest finite |q|
    // into [128, 256). For a bf16 q (8 significant bits) hi + lo is q 2^e
    // exactly when |q 2^e| >= 2^-2 (|q| >= 2^-9 of the row's largest): hi
    // keeps q's top 4 bits, and q 2^e - hi (at most half of hi's last bit, a
    // multiple of q's last bit) has at most 4 significant bits, all above
    // e4m3's subnormal step 2^-9. Smaller elements are within 2^-10 of it
    // (2^-17 of the row's largest). The two GEMMs of k32 steps take the
    // tensor time of one 16-bit GEMM. V is still converted to f16 by the
    // producer (the e4m3 P V needs V transposed and P in 8 bits); the
    // consumers multiply the row's logit scale by 2^-e (QX, as QCONV's).
    constexpr bool K8 = F8 && D == 128 && QT == 0;
    using C = Cfg<D, F8, (XV & 16) != 0, DUO, K8>;
    constexpr int BM = C::BM;
    constexpr int NCW = C::NCW;
    constexpr int NTHREADS = C::NTHREADS;
    constexpr int NC = 128 * NCW;  // consumer threads
    // Operand dtype of both GEMMs: the Q dtype, or f16 for e4m3 K/V (every
    // e4m3 value is an f16 value: one conversion instruction per two; a bf16
    // Q tile is converted to f16 once per item, each row scaled by 2^-qs
    // when its largest finite |q| is 2^15 or more; P is then f16).
    constexpr int MT = F8 ? 1 : QT;
    constexpr bool QCONV = F8 && QT == 0;
    constexpr int BN = C::BN;
    constexpr int CPR = C::CPR;
    constexpr int NS = BN / 2;   // S accumulator registers per thread
    constexpr int NO = D / 2;    // O accumulator registers per thread
    constexpr int KSTEPS = BN / 16;
    constexpr int VMW = C::VMW;

    extern __shared__ __align__(16) u8 smem_raw[];
    const u32 raw_base = smem_u32(smem_raw);
    const u32 base = (raw_base + 1023u) & ~1023u;
    u8* smem = smem_raw + (base - raw_base);
    u32* vm_s = reinterpret_cast<u32*>(smem + C::VM_OFF);
    constexpr int KST = C::KST;
    constexpr int VST = C::VST;
    constexpr int QBUF = C::QBUF;
    const u32 bar_q = base + C::BAR_OFF;          // [QBUF] Q landed
    const u32 bar_qe = bar_q + 8 * QBUF;          // [QBUF] Q consumed (the last S of an item issued and done)
    const u32 bar_fk = bar_qe + 8 * QBUF;         // [KST] K landed
    const u32 bar_ek = bar_fk + 8 * KST;          // [KST] K consumed
    const u32 bar_fv = bar_ek + 8 * KST;          // [VST] V landed
    const u32 bar_ev = bar_fv + 8 * VST;          // [VST] V consumed
    const u32 bar_if = bar_ev + 8 * VST;          // [2] work item published
    const u32 bar_ie = bar_if + 16;               // [2] work item read by all
    const u32 bar_ig = bar_ie + 16;               // [2] work item's geometry published
    const u32 bar_qr = bar_ig + 16;               // [QBUF] e4m3 only: Q's TMA boxes landed
    // The rings run on across a CTA's items: T0 counts the KV tiles of the
    // CTA's earlier items (per role, the same count), tile t of an item is
    // ring tile T0 + t; nq counts the items that loaded a Q tile (item nq
    // uses Q buffer nq % QBUF).
    int T0 = 0;
    int nq = 0;
    auto kslot = [&](int t) { return (T0 + t) % KST; };
    auto kpar = [&](int t) { return (u32)(((T0 + t) / KST) & 1); };
    auto vslot = [&](int t) { return (T0 + t) % VST; };
    auto vpar = [&](int t) { return (u32)(((T0 + t) / VST) & 1); };

    // Work items in the grid order (q tiles fastest, so that the CTAs
    // resident at once share one (request, KV head) and read its K/V from
    // L2; within it the heaviest q tiles first). CTA c starts with item c;
    // with fewer CTAs than items (persistent grid) thread 0 then takes the
    // next item from the counter p.work[0] and publishes it in a 2-slot
    // shared ring (full: 1 arrival; empty: the other 383 threads, the
    // consumers after their epilogue); the last CTA to run out resets the
    // counters for the next launch. Producer warp 0 computes each item's
    // geometry (dependent global loads) and publishes it in the slot too
    // (bar_ig): the consumers read it there, so those loads leave their item
    // start (the producer runs ahead of them).
    const int tid = threadIdx.x;
    const int G = p.group;
    const int items = p.q_tiles * p.kv_splits * p.num_kv_heads * p.bs;  // <= i32::MAX (launcher)
    const bool persistent = C::PERSISTENT && (int)gridDim.x < items;
    i32* item_s = reinterpret_cast<i32*>(smem + C::ITEM_OFF);
    int n_items = 0;  // items taken by this thread so far (the stop included)
    // Thread 0 fetches each counter value one item ahead (the atomic's round
    // trip then overlaps the current item); a CTA's last fetch comes before
    // its stop, so the reset below still sees every fetch done.
    u32* pending = reinterpret_cast<u32*>(item_s + 2);
    Item* item_geom_s = reinterpret_cast<Item*>(smem + C::ITEM_OFF + 16);
    // consumer = true: the caller arrives on the slot's empty barrier itself
    // (`release_item`), after it has read the item's published geometry.
    auto next_item = [&](bool consumer) -> int {
        const int n = n_items++;
        if (!persistent) return n == 0 ? (int)blockIdx.x : items;
        const int slot = n & 1;
        const u32 par = (u32)((n >> 1) & 1);
        int it;
        if (tid == 0) {
            if (n >= 2) mbar_wait(bar_ie + 8 * slot, par ^ 1);
            const u32 u = n == 0 ? blockIdx.x : gridDim.x + *pending;
            it = u < (u32)items ? (int)u : items;
            if (it < items) *pending = atomicAdd(p.work, 1u);
            item_s[slot] = (i32)it;
            mbar_arrive(bar_if + 8 * slot);
            if (it == items) {
                __threadfence();
                if (atomicAdd(p.work + 1, 1u) == gridDim.x - 1) {
                    __threadfence();
                    atomicExch(p.work, 0u);
                    atomicExch(p.work + 1, 0u);
                }
            }
        } else {
            mbar_wait(bar_if + 8 * slot, par);
            it = item_s[slot];
            if (!consumer) mbar_arrive(bar_ie + 8 * slot);
        }
        return it;
    };

    // K/V by TMA boxes of tma_rows keys (one producer thread arrives, the
    // copies complete the transaction count) or by the cp.async row gather.
    const bool tma = !F8 && p.tma_rows > 0;  // e4m3 always gathers
    constexpr bool TR = (XV & 8) != 0;
    static_assert(!TR || NCW == 2, "trace layout: three roles");
    // Three consumers (D 64 16-bit): each warpgroup runs its tiles one step
    // after the other (S_t, softmax, P_t V_t, each GEMM waited for), so the
    // S accumulators and P are never live together (152 registers a
    // consumer); the other two warpgroups keep the tensor cores busy.
    constexpr bool SERIAL3 = NCW == 3;
    // SX (experiment XV & 4096, two consumers): cuDNN's schedule, read in its
    // SASS (session 24): each warpgroup runs its tiles serially as the three
    // consumers do, and the two warpgroups' exponential sections alternate
    // (named barriers 4 + c, "warpgroup c may run its exponentials"), so that
    // while one warpgroup runs its softmax the other's GEMMs hold the tensor
    // cores, and no softmax shares the MUFU / FMA pipes with the other's.
    constexpr bool SX = NCW == 2 && (XV & 4096) != 0;
    // EXT (experiment XV & 16384, two overlapped consumers): the default
    // loop (S_t beside P_{t-1} V_{t-1}) with the exponential sections taking
    // turns as in SX (named barriers 8 + c, so that the ping-pong variant's
    // 4 / 5 stay apart), and the row sums from the packed P under the next
    // S GEMM (`psum`, between the issue of S_t and of P_{t-1} V_{t-1}), so
    // that only the XOR that pins them (see `softmax`) reads an exponential
    // inside the section: one warp a scheduler then runs its exponentials
    // near the MUFU's pace while the other warpgroup issues, takes its max
    // or packs.
    constexpr bool EXT = NCW == 2 && !SX && (XV & 16384) != 0;
    // The gather's producer (16-bit and e4m3 K/V) looks its key rows' pages
    // up with a cursor per lane (advanced by BN / page_size pages and
    // BN % page_size rows a tile; one division an item, not one a tile)
    // and, where the launcher found every K / V stride and in-page offset
    // within i32 (p.narrow = 1, `context_sm90_cursor_fits`), forms its K / V
    // row addresses from 32-bit products (`(u64) id * stride_page` plus the
    // row's in-page offset, the head's part once per item) instead of three
    // 64-bit multiplies an address; page-table entries are read through the
    // request's 64-bit row pointer in both forms. Measured as experiment `_x32768` (session 26): the
    // producer's gather loop 333 -> 284 instructions a tile (SASS), bs 8 x
    // 4096 -1.5% and bs 1 x 16384 -1.9% in time, bit-identical results.
    // The experiment entries (XV != 0) build only the 32-bit form (the
    // launcher refuses them where offsets do not fit): with both, ptxas
    // spilled in the traced producer.
    const bool narrow = XV != 0 || p.narrow != 0;
    // The no-K/V-reads experiment keeps a division a tile instead of the
    // cursor (its four registers made ptxas spill its producer).
    constexpr bool CURSOR = (XV & 4) == 0;
    // Row sums from the packed P (SX, EXT) instead of the f32 exponentials.
    constexpr bool PSUM = SX || EXT;
    constexpr bool SERIAL = SERIAL3 || SX;
    static_assert(!SERIAL || C::STAGE_O, "serial consumers: Q released after the epilogue");
    // Where O is rescaled by a tile's alpha (see `rescale_o`): late, after
    // the wait for P V (the default), or early, under S (experiment XV & 32).
    constexpr bool EARLY = (XV & 32) != 0;
    // A quarter of the exponentials by polynomial on the FMA pipe instead
    // of MUFU (timing experiment XV & 64, see `ex2_poly`).
    constexpr bool POLY = (XV & 64) != 0;
    // TCSUM (timing experiment XV & 128): the row sums of P on the tensor
    // cores, an m64n8k16 wgmma of P with a B of ones beside each P V step
    // (every column of its accumulator is the row sum, rescaled with O),
    // instead of one FADD per score; the pin store then depends on the
    // scores through an XOR of their bits (LOP3, three inputs an op). The
    // ones live in the pin region's upper half (the pin is one word a warp).
    constexpr bool TCSUM = (XV & 128) != 0;
    static_assert(!SERIAL || !TCSUM, "serial consumers: no tensor-core row sums");
    static_assert(!TCSUM || C::PIN_OFF % 16 == 0, "TCSUM: the ones need a 16-byte aligned region");
    // Leave-one-stage-out timing experiments: NOSCAN (XV & 512; correct on
    // finite V) skips the scan of masked tiles' V, NOSTORE (XV & 1024;
    // wrong results) the epilogue's global stores.
    constexpr bool NOSCAN = (XV & 512) != 0;
    constexpr bool NOSTORE = (XV & 1024) != 0;
    // TRIM: the causal diagonal tile trimmed. Where every row of a consumer
    // warpgroup lies before the middle of its item's last KV tile (the
    // largest position of its rows < the tile's first key + BN / 2), that
    // warpgroup runs the tile as its first BN / 2 keys: S = Q K^T as an
    // m64n(BN/2) GEMM, the softmax over those scores, P V over KSTEPS / 2
    // steps. The tile's other keys are causally masked for each of its rows,
    // so they only added zero weights: same result (bit for bit: the sums
    // and P V added exact zeros), half the GEMM work and exponentials of
    // that tile. With 16-token warpgroups (GQA 4 packs 64 rows) that is half
    // of the items' diagonal tiles. At D 256 (BN 64: m64n32 S, 2 of 4 P V
    // steps) only where the trimmed tile is not the item's first (tile 0
    // trimmed serialized the 16-bit entries' wgmmas, C7511), and the last
    // P V reads the trim from the geometry, not from a flag (which spilled).
    // Not in the duo entries (BN 64), nor in the
    // experiment entries (the trace and no-V-scan entries then serialized
    // their wgmmas for want of registers: ptxas C7511; they run whole tiles,
    // as the production entries under variant 4), nor for an item's only
    // tile where a bf16 Q is converted for e4m3 K/V (QCONV: C7511 there);
    // off with schedule variant bit 2 (an A/B).
    constexpr bool TRIM = (BN == 128 || (D == 256 && !DUO)) && XV == 0;
    // TMA stores of the output rows (p.o_tma, see the epilogue): not with
    // three serial consumers (D 64 16-bit) nor in the no-K/V-reads timing
    // experiments (XV & 4), where the store's issue code made ptxas spill
    // (4-8 bytes); those store by threads (the launcher sets p.o_tma only
    // for two consumers).
    constexpr bool OTMA = !SERIAL3 && (XV & 4) == 0;
    // Q by TMA (p.q_tma: the launcher's map of `q`, dims [D, Hq, tokens],
    // box [64, G, BM / G], set when G divides BM): producer thread 0 issues
    // D / 64 boxes of an item's BM packed rows (whole tokens of the G heads
    // of its KV head) into the Q buffer, the operand layout. Rows past the
    // request's last token hold the next tokens' q (zeros past the tensor):
    // padding rows, which see no key and are never stored. With e4m3 K/V
    // and a bf16 Q (QCONV) the boxes complete on bar_qr and the producer
    // then converts Q in place as after its own copies.
    const bool qtma = p.q_tma != 0;
    // Trace stamp ev of this role's current item (thread 0 of a warpgroup);
    // `done`: the role's item count, at its exit.
    auto mark = [&](int role, int ev, u32 v) {
        if constexpr (TR) {
            const int n = n_items - 1;
            if (blockIdx.x < TR_CTAS && n < TR_ITEMS - 1 && (tid & 127) == 0)
                reinterpret_cast<u32*>(p.partial)[((blockIdx.x * TR_ITEMS + n) * 3 + role) * TR_EV + ev] = v;
        }
    };
    // Adds v to stamp ev of this role's current item (after its mark(.., 0)).
    auto mark_add = [&](int role, int ev, u32 v) {
        if constexpr (TR) {
            const int n = n_items - 1;
            if (blockIdx.x < TR_CTAS && n < TR_ITEMS - 1 && (tid & 127) == 0) {
                u32* a = reinterpret_cast<u32*>(p.partial) + ((blockIdx.x * TR_ITEMS + n) * 3 + role) * TR_EV + ev;
                asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;\n" ::"l"(a), "r"(v) : "memory");
            }
        }
    };
    auto done = [&](int role) {
        if constexpr (TR) {
            if (blockIdx.x < TR_CTAS && (tid & 127) == 0)
                reinterpret_cast<u32*>(p.partial)[((blockIdx.x * TR_ITEMS + TR_ITEMS - 1) * 3 + role) * TR_EV + TR_EV - 1] =
                    (u32)(n_items - 1);
        }
    };
    auto tnow = [&]() -> u32 {
        if constexpr (TR) return clk32();
        return 0u;
    };
    if (tid == 0) {
        *reinterpret_cast<u64*>(smem + C::OMAP_OFF) = reinterpret_cast<u64>(&tmap_o);
        *reinterpret_cast<u64*>(smem + C::QMAP_OFF) = reinterpret_cast<u64>(&tmap_q);
#pragma unroll
        for (int s = 0; s < QBUF; ++s) {
            // TMA: thread 0's arrival + the boxes' bytes; else 128 cp.async
            // arrivals, or (e4m3, QCONV) the 128 converting threads'.
            mbar_init(bar_q + 8 * s, qtma && !QCONV ? 1 : 128);
            if (F8) mbar_init(bar_qr + 8 * s, 1);
            mbar_init(bar_qe + 8 * s, NC);
        }
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            mbar_init(bar_if + 8 * s, 1);
            mbar_init(bar_ie + 8 * s, NTHREADS - 1);
            mbar_init(bar_ig + 8 * s, 1);
        }
#pragma unroll
        for (int s = 0; s < KST; ++s) {
            // gather: 128 cp.async + 128 thread arrivals; e4m3: 128 thread arrivals
            mbar_init(bar_fk + 8 * s, tma ? 1 : F8 && !K8 ? 128 : 256);
            mbar_init(bar_ek + 8 * s, NC);
        }
#pragma unroll
        for (int s = 0; s < VST; ++s) {
            mbar_init(bar_fv + 8 * s, tma ? 1 : 128);
            mbar_init(bar_ev + 8 * s, NC);
        }
    }
    __syncthreads();

    if (tid < 128) {
        // ================================ producer ================================
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::PRODUCER_REGS));
        const int pt = tid;
        // Gather: eight lanes per 128-byte line of a key row (lane chunk c8 of
        // each 64-column atom), sixteen rows per pass, NP passes per tile.
        // Lane l of warp w looks up the page of key row krow (when it has one,
        // c8 < NP) and shares the row's address with the other seven lanes.
        constexpr int NP = BN / 16;
        for (;;) {
            const int it = next_item(false);
            if (it >= items) {
                done(0);
                break;
            }
            mark(0, 0, tnow());
            // The lane's roles, derived per item from an opaque thread index:
            // kept live across the item loop, they would not fit the
            // producer's registers.
            u32 ptv;
            asm volatile("mov.u32 %0, %%tid.x;" : "=r"(ptv));
            const int c8 = (int)ptv & 7;
            const int rg = (int)ptv >> 3;  // row of pass 0: 4 w + (l >> 3)
            const bool has_row = c8 < NP;
            const int krow = key_row_of_lane((int)ptv >> 5, (int)ptv & 31);
            const Item I = item_geom<BN, BM>(p, it, pt == 0);
            if (pt == 0) {
                // Published for the consumers (they release the slot, bar_ie,
                // after their epilogue).
                item_geom_s[(n_items - 1) & 1] = I;
                mbar_arrive(bar_ig + 8 * ((n_items - 1) & 1));
            }
            if (I.skip) continue;
            const int h = I.h, b = I.b, rows = I.rows, ntiles = I.ntiles;
            const Geom& g = I.g;
            const i32 r0 = I.r0, k_lo = I.k_lo, k_hi = I.k_hi, t_first = I.t_first;
            if (I.tile == 0 && h == 0 && I.split == 0) report_bad_pages(p, g, b, pt, 128);
            if (ntiles == 0) continue;  // rows that see no key: the consumers write zeros
            const i32* pt_row = p.page_table + (i64)b * p.page_table_stride;
            // Page id of this lane's key row of tile t (called for t = 0, 1,
            // ... in order): -2 when the row is not needed (no row, outside
            // [k_lo, k_hi) or past the item's tiles), -1 past the table or
            // negative there; its offset in the page goes to next_off. The
            // cursor: the page and in-page row of the lane's key row in the
            // tile looked up next, and a tile's step in pages and rows.
            i32 next_off = 0;
            i32 cur_pg = 0, cur_off = 0, step_pg = 0, step_off = 0;
            if (CURSOR && !tma) {
                const i32 k0 = t_first * BN + krow;
                cur_pg = k0 / p.page_size;
                cur_off = k0 - cur_pg * p.page_size;
                step_pg = BN / p.page_size;
                step_off = BN - step_pg * p.page_size;
            }
            auto page_id = [&](int t) {
                const i32 k = (t_first + t) * BN + krow;
                const bool need = has_row && t < ntiles && k >= k_lo && k < k_hi;
                i32 pg;
                if constexpr (CURSOR) {
                    pg = cur_pg;
                    next_off = cur_off;
                    cur_off += step_off;
                    cur_pg += step_pg;
                    if (cur_off >= p.page_size) {
                        cur_off -= p.page_size;
                        ++cur_pg;
                    }
                } else {
                    pg = k / p.page_size;
                    next_off = k - pg * p.page_size;
                }
                // A negative id in the table is bad (-1), never "not needed".
                return !need ? -2 : pg < p.max_num_pages ? max(__ldg(pt_row + pg), -1) : -1;
            };
            // Tile 0's page id (gather) is read before the Q copies go out, so
            // that its latency overlaps them.
            i32 next_id = tma ? -1 : page_id(0);
            // Q: packed rows r0 .. r0 + rows into Q buffer qb (the cp.async
            // copies write zeros past `rows`, TMA the next tokens' q), once
            // the last S of the item that used it before is done.
            const int qb = nq % QBUF;
            if (nq >= QBUF) mbar_wait(bar_qe + 8 * qb, (u32)(((nq - QBUF) / QBUF) & 1));
            // Thread pt copies chunk pt % CPR of rows pt / CPR + QRS m; the
            // row's (token j, head gq) advances by QRS rows a step.
            if (qtma) {
                if (pt == 0) {
                    u64 map;
                    asm volatile("ld.shared.u64 %0, [%1];\n" : "=l"(map) : "r"(base + C::QMAP_OFF));
                    const u32 qdst = base + C::Q_OFF + qb * C::Q_BYTES;
                    const int tok = g.row_start + r0 / G;  // G divides r0 (launcher: G | BM)
                    const u32 qbar = (QCONV ? bar_qr : bar_q) + 8 * qb;
                    mbar_arrive_expect_tx(qbar, (u32)C::Q_BYTES);
#pragma unroll
                    for (int a = 0; a < D / 64; ++a) tma_load_3d(qdst + a * C::Q_ATOM, map, qbar, 64 * a, h * G, tok);
                }
            } else {
                constexpr int QRS = 128 / CPR;
                const int ch = (int)ptv % CPR;
                int row = (int)ptv / CPR;
                int j = (r0 + row) / G;
                int gq = r0 + row - j * G;
                const int sj = QRS / G, sg = QRS - (QRS / G) * G;
#pragma unroll 1
                for (; row < BM; row += QRS) {
                    const bool valid = row < rows;
                    const u16* src = p.q;
                    if (valid)
                        src += (i64)(g.row_start + j) * p.q_stride_tok + (i64)(h * G + gq) * p.q_stride_head + ch * 8;
                    cp_async16(base + C::Q_OFF + qb * C::Q_BYTES + swz(row, ch, C::Q_ATOM), src, valid ? 16u : 0u);
                    j += sj;
                    gq += sg;
                    if (gq >= G) {
                        gq -= G;
                        ++j;
                    }
                }
            }
            if constexpr (QCONV) {
                // bf16 Q -> f16 in place (the chunks this thread copied), row
                // by row: a row whose largest finite |q| is >= 2^15 is scaled
                // by 2^-qs, the power of two that brings it below 2^16 (f16's
                // range), and the consumers multiply that row's logit scale by
                // 2^qs; other rows convert exactly (|q| >= 2^-14; smaller values
                // round to f16 subnormals). Non-finite q stay non-finite and do
                // not count. The CPR lanes of a row are CPR consecutive lanes.
                if (qtma)
                    mbar_wait(bar_qr + 8 * qb, (u32)((nq / QBUF) & 1));
                else
                    asm volatile("cp.async.wait_all;\n" ::: "memory");
                constexpr int QRS = 128 / CPR;
                const int ch = (int)ptv % CPR;
                u8* const qt = smem + C::Q_OFF + qb * C::Q_BYTES;
                u8* const qsr = smem + C::QX_OFF + qb * BM;
                if constexpr (K8) {
                    // Chunk ch (columns 8 ch .. 8 ch + 7) of each row: hi and
                    // lo, 8 bytes each, at byte 8 (ch & 1) of 16-byte chunk
                    // ch / 2 of the row in the e4m3 operand layout (rows of
                    // 128 bytes; hi in the buffer's first BM x 128 bytes, lo
                    // in the next). Non-finite q: hi and lo NaN (x - x is NaN
                    // there; e4m3 has no infinity, satfinite would clamp it).
                    // In place: a row's 256 bytes (its f16 chunks, then its
                    // hi and lo) are read and written by the CPR lanes of that
                    // row alone, and every lane's stores follow the row max's
                    // shuffles, which follow every lane's loads.
                    const u32 qb0 = base + C::Q_OFF + qb * C::Q_BYTES;  // qt's shared address
#pragma unroll 2
                    for (int row = (int)ptv / CPR; row < BM; row += QRS) {
                        const uint4 u = *reinterpret_cast<const uint4*>(qt + swz(row, ch, C::Q_ATOM));
                        const u32 w4[4] = {u.x, u.y, u.z, u.w};
                        const u32 mx = bf16_row_absmax<CPR>(w4);
                        // 2^e brings the largest |q| (biased exponent E) into
                        // [128, 256): e = 134 - E, within [-126, 126].
                        const int e = mx == 0 ? 0 : max(-126, min(126, 134 - (int)(mx >> 7)));
                        const float f = __int_as_float((127 + e) << 23);
                        u32 hw[2], lw[2];
#pragma unroll
                        for (int k = 0; k < 4; k += 2) {
                            u32 h2[2], l2[2];
#pragma unroll
                            for (int j = 0; j < 2; ++j) {
                                const u32 w = w4[k + j];
                                const u32 x = pack2<1>(__uint_as_float(w << 16) * f, __uint_as_float(w & 0xffff0000u) * f);
                                e4m3x2_split(x, h2[j], l2[j]);
                            }
                            hw[k / 2] = h2[0] | (h2[1] << 16);
                            lw[k / 2] = l2[0] | (l2[1] << 16);
                        }
                        const u32 d = (u32)(row * 128 + ((((ch >> 1) ^ (row & 7))) << 4) + (ch & 1) * 8);
                        asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(qb0 + d), "r"(hw[0]), "r"(hw[1]) : "memory");
                        asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(qb0 + C::Q_ATOM + d), "r"(lw[0]), "r"(lw[1])
                                     : "memory");
                        // The consumers scale the row's logits by 2^-e (a signed byte).
                        if (ch == 0) qsr[row] = (u8)(-e);
                    }
                } else
#pragma unroll 2
                for (int row = (int)ptv / CPR; row < BM; row += QRS) {
                    uint4* a = reinterpret_cast<uint4*>(qt + swz(row, ch, C::Q_ATOM));
                    const uint4 u = *a;
                    const u32 w4[4] = {u.x, u.y, u.z, u.w};
                    const u32 mx = bf16_row_absmax<CPR>(w4);
                    const int e = (int)(mx >> 7);  // biased exponent of the row's largest finite |q|
                    const int qs = e >= 142 ? e - 141 : 0;
                    const float f = __int_as_float((127 - qs) << 23);  // 2^-qs (qs <= 113)
                    u32 h[4];
#pragma unroll
                    for (int k = 0; k < 4; ++k)
                        h[k] = pack2<1>(__uint_as_float(w4[k] << 16) * f, __uint_as_float(w4[k] & 0xffff0000u) * f);
                    *a = make_uint4(h[0], h[1], h[2], h[3]);
                    if (ch == 0) qsr[row] = (u8)qs;
                }
                fence_proxy_async();
                mbar_arrive(bar_q + 8 * qb);
            } else {
                if (!qtma) mbar_arrive_cp_async(bar_q + 8 * qb);
                mark(0, 1, tnow());
            }

            if (tma) {
                // One warp: lane j looks up the page of box j of a tile (one
                // tile ahead) and lane 0 issues the boxes, D / 64 per box (one
                // per 64-column atom; the tensor maps' 128-byte swizzle matches
                // the operand layout). A box that is not needed or on a bad page
                // is issued at page coordinate num_pages: zero-filled, masked.
                if (pt < 32) {
                    const int lane = pt;
                    const int rows = p.tma_rows;               // keys per box
                    const int nbox = BN / min(rows, BN);       // boxes per tile (1..16)
                    const int dt = p.tma_dims & 15, dh = (p.tma_dims >> 4) & 15;
                    // Lane's box of tile t: its page id, -1 on a bad page, -2
                    // when the box is not needed (zero-filled; its keys count
                    // as valid, masked by position as in the gather).
                    auto box_page = [&](int t) {
                        const i32 k = (t_first + t) * BN + lane * rows;
                        const bool need = t < ntiles && lane < nbox && k < k_hi && k + rows > k_lo;
                        const i32 pg = need ? k / p.page_size : 0;
                        const i32 id = need && pg < p.max_num_pages ? __ldg(pt_row + pg) : -1;
                        return !need ? -2 : id >= 0 && id < p.num_pages ? id : -1;
                    };
                    // Valid-key mask word w of a tile (layout: key_row_of_lane)
                    // from the per-box valid bits vb (warp-wide).
                    const int box_rows = min(rows, BN);
                    auto key_mask = [&](u32 vb, int w) {
                        const int r = key_row_of_lane(w, lane);
                        return __ballot_sync(0xffffffffu, r >= BN || ((vb >> (r / box_rows)) & 1u));
                    };
                    auto issue = [&](const TmaMap& map, u32 dst_tile, u32 bar, int t, i32 id) {
                        const i32 k0 = (t_first + t) * BN;
                        const int tok0 = rows >= BN ? k0 % p.page_size : 0;
#pragma unroll 1
                        for (int j = 0; j < nbox; ++j) {
                            const i32 idj = __shfl_sync(0xffffffffu, id, j);
                            if (lane == 0 && !(XV & 4)) {
                                const int pg = idj >= 0 ? idj : p.num_pages;
                                // Coordinate of tensor-map dim `d` (1..3): token, head or page.
                                auto coord = [&](int d) { return d == dt ? tok0 : d == dh ? h : pg; };
                                const int c1 = coord(1), c2 = coord(2), c3 = coord(3);
#pragma unroll
                                for (int a = 0; a < D / 64; ++a)
                                    tma_load_4d(dst_tile + a * C::KV_ATOM + j * rows * 128, map, bar, 64 * a, c1,
                                                c2, c3);
                            }
                        }
                    };
                    constexpr u32 TX = XV & 4 ? 0u : (u32)C::KV_BYTES;
                    i32 id_next = box_page(0);
                    i32 id_prev = -1;  // V of the previous tile
                    for (int t = 0; t < ntiles; ++t) {
                        const i32 id = id_next;
                        id_next = box_page(t + 1);
                        const u32 vb = __ballot_sync(0xffffffffu, id != -1);
                        u32 km[VMW];
#pragma unroll
                        for (int w = 0; w < VMW; ++w) km[w] = key_mask(vb, w);
                        if (lane == 0) {
                            if (T0 + t >= KST) mbar_wait(bar_ek + 8 * kslot(t), kpar(t) ^ 1);
#pragma unroll
                            for (int w = 0; w < VMW; ++w) vm_s[kslot(t) * VMW + w] = km[w];
                            mbar_arrive_expect_tx(bar_fk + 8 * kslot(t), TX);  // releases the mask
                        }
                        __syncwarp();
                        issue(tmap_k, base + C::K_OFF + kslot(t) * C::KV_BYTES, bar_fk + 8 * kslot(t), t, id);
                        if (t >= 1) {
                            if (lane == 0) {
                                if (T0 + t - 1 >= VST) mbar_wait(bar_ev + 8 * vslot(t - 1), vpar(t - 1) ^ 1);
                                mbar_arrive_expect_tx(bar_fv + 8 * vslot(t - 1), TX);
                            }
                            __syncwarp();
                            issue(tmap_v, base + C::V_OFF + vslot(t - 1) * C::KV_BYTES, bar_fv + 8 * vslot(t - 1), t - 1,
                                  id_prev);
                        }
                        id_prev = id;
                    }
                    if (ntiles >= 1) {
                        const int t = ntiles - 1;
                        if (lane == 0) {
                            if (T0 + t >= VST) mbar_wait(bar_ev + 8 * vslot(t), vpar(t) ^ 1);
                            mbar_arrive_expect_tx(bar_fv + 8 * vslot(t), TX);
                        }
                        __syncwarp();
                        issue(tmap_v, base + C::V_OFF + vslot(t) * C::KV_BYTES, bar_fv + 8 * vslot(t), t, id_prev);
                    }
                }  // pt < 32: warps 1-3 copy Q only
            } else if constexpr (!F8) {
                // Eight lanes per 128-byte line (whole L2 lines per warp access:
                // four rows x 128 bytes), so that each copy instruction takes the
                // fewest shared-memory wavefronts. Each lane resolves its key row
                // krow of tile t (page id read one tile ahead) to K and V row
                // addresses; pass i copies row rg + 16 i, whose address comes
                // from lane (l & 24) | i. Rows not read (not needed, bad page)
                // are zero-filled (source size 0; the address is then the pool's
                // base and is not read). V of a tile goes out one tile after its K.
                const u16* const k_base = reinterpret_cast<const u16*>(p.k_cache);
                const u16* const v_base = reinterpret_cast<const u16*>(p.v_cache);
                const u16* k_row = k_base;  // this lane's row of the tile being issued
                const u16* v_row = v_base;  // this lane's row of the previous tile (V)
                const u16* v_next = v_base;
                u32 k_rd = 0, v_rd = 0;     // rows read, by source lane (ballot)
                // narrow: the head's in-page offsets (elements; i32 by the
                // launcher's check).
                const u32 k_head = (u32)h * (u32)p.k_stride_head;
                const u32 v_head = (u32)h * (u32)p.v_stride_head;
                auto lookup = [&](int t) {
                    const i32 id = next_id;
                    const i32 off = next_off;
                    const bool skip = id == -2;
                    next_id = page_id(t + 1);
                    const bool valid = id >= 0 && id < p.num_pages;
                    const bool rd = valid && !(XV & 4);
                    k_row = k_base;
                    v_next = v_base;
                    if (rd) {
                        if (narrow) {
                            // id >= 0 and off >= 0 here: unsigned products,
                            // one wide multiply-add per address.
                            const u32 k_in = k_head + (u32)off * (u32)p.k_stride_tok;
                            const u32 v_in = v_head + (u32)off * (u32)p.v_stride_tok;
                            k_row = k_base + ((u64)(u32)id * (u32)p.k_stride_page + k_in);
                            v_next = v_base + ((u64)(u32)id * (u32)p.v_stride_page + v_in);
                        } else {
                            // 64-bit products, the head's from an opaque copy
                            // of h (not hoisted, as in page_id).
                            i32 hw = h;
                            asm volatile("" : "+r"(hw));
                            k_row = k_base + (i64)id * p.k_stride_page + (i64)hw * p.k_stride_head +
                                    (i64)off * p.k_stride_tok;
                            v_next = v_base + (i64)id * p.v_stride_page + (i64)hw * p.v_stride_head +
                                     (i64)off * p.v_stride_tok;
                        }
                    }
                    k_rd = __ballot_sync(0xffffffffu, rd);
                    // Valid-key mask word of this warp (layout: key_row_of_lane).
                    // A row not needed (zero-filled) counts as valid: every row
                    // of the item masks it by position (keys >= k_hi lie past
                    // its last row, keys < k_lo before its window), so the
                    // causal diagonal tile keeps the one-compare mask.
                    const u32 m = __ballot_sync(0xffffffffu, !has_row || valid || skip);
                    if ((pt & 31) == 0) vm_s[kslot(t) * VMW + (pt >> 5)] = m;
                };
                // The lane's destination offset in a tile, opaque so that the
                // compiler does not keep every pass's address in registers.
                u32 dst_lane = (u32)rg * 128u + ((u32)(c8 ^ (rg & 7)) << 4);
                asm volatile("" : "+r"(dst_lane));
                auto copy_rows = [&](u32 dst_tile, const u16* row, u32 rdm) {
                    // The source lanes' read bits shifted once (pass i tests
                    // bit i, i < 8: one instruction instead of three).
                    const u32 rdl = rdm >> (pt & 24);
#pragma unroll
                    for (int i = 0; i < NP; ++i) {
                        const u16* r = shfl_ptr8(row, i) + 8 * c8;  // lane (pt & 24) | i
                        const u32 bytes = ((rdl >> i) & 1u) * 16u;
#pragma unroll
                        for (int a = 0; a < D / 64; ++a)
                            cp_async16(dst_tile + dst_lane + i * 16 * 128 + a * C::KV_ATOM, r + 64 * a, bytes);
                    }
                };
                for (int t = 0; t < ntiles; ++t) {
                    if (T0 + t >= KST) mbar_wait(bar_ek + 8 * kslot(t), kpar(t) ^ 1);
                    lookup(t);
                    copy_rows(base + C::K_OFF + kslot(t) * C::KV_BYTES, k_row, k_rd);
                    mbar_arrive_cp_async(bar_fk + 8 * kslot(t));
                    mbar_arrive(bar_fk + 8 * kslot(t));  // releases the valid mask written by lookup
                    if (t <= 1) mark(0, 2 + t, tnow());
                    if (t >= 1) {
                        if (T0 + t - 1 >= VST) mbar_wait(bar_ev + 8 * vslot(t - 1), vpar(t - 1) ^ 1);
                        copy_rows(base + C::V_OFF + vslot(t - 1) * C::KV_BYTES, v_row, v_rd);
                        mbar_arrive_cp_async(bar_fv + 8 * vslot(t - 1));
                    }
                    v_row = v_next;
                    v_rd = k_rd;
                }
                if (ntiles >= 1) {
                    const int t = ntiles - 1;
                    if (T0 + t >= VST) mbar_wait(bar_ev + 8 * vslot(t), vpar(t) ^ 1);
                    copy_rows(base + C::V_OFF + vslot(t) * C::KV_BYTES, v_row, v_rd);
                    mbar_arrive_cp_async(bar_fv + 8 * vslot(t));
                }
            } else {
                // e4m3 K/V: the same row gather (lane roles, page lookups and
                // valid mask as above) into the staging ring of 8-bit tiles,
                // rows of D bytes; then each thread converts the chunks it
                // copied itself (no barrier between copy and conversion: its
                // own cp.async wait suffices) to the Q dtype (exact) into the
                // K / V ring slot in the swizzled operand layout, fences its
                // stores against the async proxy (wgmma reads them) and
                // arrives. Step s copies K of tile s and V of tile s - 1 into
                // staging step s % SST; with SST = 2 the copies of step s + 1
                // are in flight while step s converts.
                constexpr int RB = D;             // bytes per staged key row
                constexpr int CH = D / 16;        // 16-byte chunks per staged row (4, 8, 16)
                constexpr int CA = (CH + 7) / 8;  // chunks per lane and row
                constexpr int SST = C::SST;
                constexpr int AHEAD = SST - 1;    // steps copied ahead of the conversion
                const u8* const k_base = p.k_cache;
                const u8* const v_base = p.v_cache;
                const u8* k_row = k_base;  // this lane's row of the last K tile copied
                const u8* v_row = v_base;  // this lane's row of the V tile copied next
                const u8* v_next = v_base;
                u32 k_rd = 0, v_rd = 0;    // rows read, by source lane (ballot)
                u32 m_last = 0;            // valid-key mask word of the last K tile looked up
                auto lookup = [&](int t) {
                    const i32 id = next_id;
                    const i32 off = next_off;
                    const bool skip = id == -2;
                    next_id = page_id(t + 1);
                    const bool valid = id >= 0 && id < p.num_pages;
                    k_row = k_base;
                    v_next = v_base;
                    if (valid && narrow) {
                        // As the 16-bit gather's (id >= 0, off >= 0).
                        const u32 k_in = (u32)h * (u32)p.k_stride_head + (u32)off * (u32)p.k_stride_tok;
                        const u32 v_in = (u32)h * (u32)p.v_stride_head + (u32)off * (u32)p.v_stride_tok;
                        k_row = k_base + ((u64)(u32)id * (u32)p.k_stride_page + k_in);
                        v_next = v_base + ((u64)(u32)id * (u32)p.v_stride_page + v_in);
                    } else if (valid) {
                        k_row = k_base + (i64)id * p.k_stride_page + (i64)h * p.k_stride_head + (i64)off * p.k_stride_tok;
                        v_next = v_base + (i64)id * p.v_stride_page + (i64)h * p.v_stride_head + (i64)off * p.v_stride_tok;
                    }
                    k_rd = __ballot_sync(0xffffffffu, valid);
                    m_last = __ballot_sync(0xffffffffu, !has_row || valid || skip);  // as the 16-bit gather
                };
                // Lane chunk c8 + 8 a of staged rows rg + 16 i (D 64: lanes c8 < 4).
                const bool lane_on = CH % 8 == 0 || c8 < CH;
                u32 src_lane = (u32)rg * RB + (u32)c8 * 16u;
                // Its 16-bit destination: chunks 2 c and 2 c + 1 of the row, c = c8 + 8 a.
                u32 dst_lane = (u32)(c8 >> 2) * C::KV_ATOM + (u32)rg * 128u + ((u32)((2 * (c8 & 3)) ^ (rg & 7)) << 4);
                asm volatile("" : "+r"(src_lane), "+r"(dst_lane));
                // K8: V's staging tile of step s at slot s % SST (K is not staged).
                auto stage = [&](int s, int kv) {
                    return (u32)C::STG_OFF + (u32)((K8 ? s % SST : (s % SST) * 2 + kv) * C::F8_BYTES);
                };
                auto copy8 = [&](u32 stg, const u8* row, u32 rdm) {
                    const u32 rdl = rdm >> (pt & 24);  // as the 16-bit gather's
#pragma unroll
                    for (int i = 0; i < NP; ++i) {
                        const u8* r = shfl_ptr8(row, i) + 16 * c8;  // lane (pt & 24) | i
                        const u32 bytes = ((rdl >> i) & 1u) * 16u;
#pragma unroll
                        for (int a = 0; a < CA; ++a)
                            if (lane_on) cp_async16(base + stg + src_lane + i * 16 * RB + a * 128, r + 128 * a, bytes);
                    }
                };
                // The lane's NP * CA chunks of a tile, NB at a time: NB loads
                // in flight before their conversions (one at a time, each
                // load's latency would be exposed).
                constexpr int NCH = NP * CA;
                constexpr int NB = NCH < 4 ? NCH : 4;
                auto convert = [&](u32 dst_tile, u32 stg) {
                    if (!lane_on) return;
#pragma unroll
                    for (int c0 = 0; c0 < NCH; c0 += NB) {
                        uint4 u[NB];
#pragma unroll
                        for (int j = 0; j < NB; ++j) {
                            const int i = (c0 + j) / CA, a = (c0 + j) % CA;
                            u[j] = *reinterpret_cast<const uint4*>(smem + stg + src_lane + i * 16 * RB + a * 128);
                        }
#pragma unroll
                        for (int j = 0; j < NB; ++j) {
                            const int i = (c0 + j) / CA, a = (c0 + j) % CA;
                            u32 w[8];
                            e4m3x4_cvt<MT>(u[j].x, w[0], w[1]);
                            e4m3x4_cvt<MT>(u[j].y, w[2], w[3]);
                            e4m3x4_cvt<MT>(u[j].z, w[4], w[5]);
                            e4m3x4_cvt<MT>(u[j].w, w[6], w[7]);
                            // Chunk 2 c + 1 sits at the offset of chunk 2 c with bit 4 flipped.
                            const u32 d0 = dst_tile + dst_lane + (u32)(i * 16 * 128 + 2 * a * C::KV_ATOM);
                            *reinterpret_cast<uint4*>(smem + d0) = make_uint4(w[0], w[1], w[2], w[3]);
                            *reinterpret_cast<uint4*>(smem + (d0 ^ 16u)) = make_uint4(w[4], w[5], w[6], w[7]);
                        }
                    }
                };
                // K8: the K tile's 128-byte rows straight into its ring slot
                // (the wgmma operand layout: chunk c of row r at c ^ (r & 7)),
                // completed on the slot's full barrier as the 16-bit gather's.
                const u32 dst_k8 = (u32)rg * 128u + ((u32)(c8 ^ (rg & 7)) << 4);
                auto copy_k8 = [&](u32 dst_tile, const u8* row, u32 rdm) {
                    const u32 rdl = rdm >> (pt & 24);
#pragma unroll
                    for (int i = 0; i < NP; ++i) {
                        const u8* r = shfl_ptr8(row, i) + 16 * c8;  // lane (pt & 24) | i
                        cp_async16(dst_tile + dst_k8 + i * 16 * 128, r, ((rdl >> i) & 1u) * 16u);
                    }
                };
                // Step s: copies of K tile s (s < ntiles) and V tile s - 1 (s >= 1).
                auto issue_step = [&](int s) {
                    if (K8 && s < ntiles) {
                        if (T0 + s >= KST) mbar_wait(bar_ek + 8 * kslot(s), kpar(s) ^ 1);
                        lookup(s);
                        if ((pt & 31) == 0) vm_s[kslot(s) * VMW + (pt >> 5)] = m_last;
                        copy_k8(base + C::K_OFF + kslot(s) * C::K_BYTES, k_row, k_rd);
                        mbar_arrive_cp_async(bar_fk + 8 * kslot(s));
                        mbar_arrive(bar_fk + 8 * kslot(s));  // also releases the mask
                    } else if (s < ntiles) {
                        lookup(s);
                        copy8(stage(s, 0), k_row, k_rd);
                    }
                    if (s >= 1) copy8(stage(s, 1), v_row, v_rd);
                    if (s < ntiles) {
                        v_row = v_next;
                        v_rd = k_rd;
                    }
                };
                auto convert_step = [&](int s, u32 mask) {
                    if (!K8 && s < ntiles) {
                        if (T0 + s >= KST) mbar_wait(bar_ek + 8 * kslot(s), kpar(s) ^ 1);
                        if ((pt & 31) == 0) vm_s[kslot(s) * VMW + (pt >> 5)] = mask;
                        convert((u32)C::K_OFF + (u32)(kslot(s) * C::K_BYTES), stage(s, 0));
                        fence_proxy_async();
                        mbar_arrive(bar_fk + 8 * kslot(s));  // also releases the mask
                    }
                    if (s >= 1) {
                        if (T0 + s - 1 >= VST) mbar_wait(bar_ev + 8 * vslot(s - 1), vpar(s - 1) ^ 1);
                        convert((u32)C::V_OFF + (u32)(vslot(s - 1) * C::KV_BYTES), stage(s, 1));
                        fence_proxy_async();
                        mbar_arrive(bar_fv + 8 * vslot(s - 1));
                    }
                };
                if constexpr (AHEAD == 1) {
                    issue_step(0);
                    cp_async_commit();
                }
#pragma unroll 1
                for (int s = 0; s <= ntiles; ++s) {
                    u32 mask;
                    if constexpr (AHEAD == 1) {
                        mask = m_last;  // tile s (looked up one step ago)
                        if (s + 1 <= ntiles) issue_step(s + 1);
                        cp_async_commit();
                        cp_async_wait<1>();
                    } else {
                        issue_step(s);
                        cp_async_commit();
                        cp_async_wait<0>();
                        mask = m_last;
                    }
                    convert_step(s, mask);
                }
            }  // gather
            T0 += ntiles;
            ++nq;
        }  // items
        cp_async_wait<0>();
        return;
    }

    // ================================ consumers ================================
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::CONSUMER_REGS));
    // Warp-uniform by construction (a broadcast), so that the compiler keeps
    // the wgmma descriptors derived from it in uniform registers.
    const int cw = __shfl_sync(0xffffffffu, tid / 128 - 1, 0);  // consumer warpgroup 0/1
    const int ct = tid & 127;
    const int warp = ct >> 5;
    const int lane = ct & 31;
    const int gr = lane >> 2;
    const int qd = lane & 3;
    const int wrow0 = 64 * cw;           // first tile row of this warpgroup
    // D 256: one word for every thread, the spare word of the work-item
    // slots (the default reads no pin word back; a warp's stores to one
    // word are one transaction), so that no register holds a per-thread
    // address across the item loop (O takes 128 of the 224; with it the
    // persistent D 256 consumers spilled 4 bytes). Their per-thread pin
    // words hold each thread's item count instead (see nslot).
    const u32 pin_addr = TCSUM ? base + C::PIN_OFF + (u32)(4 * cw + warp) * 4u
                         : D == 256 && !PSUM ? base + C::ITEM_OFF + 12u
                                             : base + C::PIN_OFF + (u32)(128 * cw + ct) * 4u;
    const u32 ones_addr = base + C::PIN_OFF + 512u;  // TCSUM: 512 bytes of 16-bit ones
    // SX, EXT: this thread's pin word holds +0, read after each turn is
    // taken (see `softmax`).
    if constexpr (PSUM) asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(pin_addr), "f"(0.f) : "memory");
    if constexpr (TCSUM) {
        // Every thread writes the whole (identical) region itself, so no
        // barrier is needed before the warpgroup's first wgmma reads it.
        const u32 one2 = MT == 0 ? 0x3F803F80u : 0x3C003C00u;
#pragma unroll 1
        for (u32 b = 0; b < 512u; b += 16u)
            asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(ones_addr + b), "r"(one2) : "memory");
        fence_proxy_async();
    }
    // The Q buffer whose release (bar_qe) waits for this thread's TMA stores
    // to have read their staged rows, 0 when none: the epilogue's issuing
    // thread defers that wait to its next item's first S (the stores read
    // while the warpgroup moves on; a wait at the next item's start still
    // took ~340 cycles at D 128 32 x 512), or to its exit.
    u32 o_pend = 0;
    for (;;) {
        const int it = next_item(true);
        if (it >= items) {
            bulk_wait_if(OTMA && o_pend != 0);
            if (persistent) mbar_arrive(bar_ie + 8 * ((n_items - 1) & 1));
            done(1 + cw);
            break;
        }
        const int role = 1 + cw;
        mark(role, 0, tnow());
        // The item's geometry, published by producer warp 0 (which runs ahead
        // of the consumers), read from shared memory where it is used; the
        // slot is released after the epilogue.
        const int islot = (n_items - 1) & 1;
        // D 256: this thread's item count kept in its (otherwise unused, see
        // pin_addr) pin word across the item and read back at its end, so
        // that no register holds it beside O's 128 (ptxas spilled it); bit
        // 31 holds the parity of nq (the consumers' only use of it with one
        // Q buffer: the Q barrier's phase; with the trimmed D 256 tile ptxas
        // spilled nq too).
        const u32 nslot = base + C::PIN_OFF + (u32)(128 * cw + ct) * 4u;
        if constexpr (D == 256 && !PSUM && !TCSUM)
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(nslot), "r"((u32)n_items | ((u32)nq << 31)) : "memory");
        mbar_wait(bar_ig + 8 * islot, (u32)(((n_items - 1) >> 1) & 1));
        const Item& I = item_geom_s[islot];
        auto release_item = [&]() {
            int slot = islot;
            if constexpr (D == 256 && !PSUM && !TCSUM) {
                u32 n;
                asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(n) : "r"(nslot) : "memory");
                n_items = (int)(n & 0x7fffffffu);
                nq = (int)(n >> 31);
                slot = (n_items - 1) & 1;  // islot, not held across the item
            }
            if (persistent) mbar_arrive(bar_ie + 8 * slot);
        };
        // The last item's TMA stores release their Q buffer here when this
        // item runs no S (else after its first S, below).
        auto release_o = [&]() {
            if constexpr (OTMA) {
                bulk_wait_read_arrive_if(o_pend != 0, o_pend);
                o_pend = 0;
            }
        };
        // The item's tile count read once from the published geometry (I is
        // a shared-memory reference; reading it again where `ntiles` is
        // declared below changes every entry's SASS).
        const int item_tiles = I.ntiles;
        if (I.skip || item_tiles == 0) release_o();
        mark(role, 1, tnow());
        mark(role, 12, (u32)I.ntiles);
        mark(role, 13, (u32)it);
        // Trace: cycles of the fast tiles 1.. in issue, S wait, softmax, P V wait, rescale,
        // and (event 23) of tiles 1.. waiting for their K and the previous V.
        // Summed in the trace slots themselves (red.global.add by thread 0
        // of the warpgroup), so that no register holds them across the loop.
#pragma unroll
        for (int k = 0; k < 5; ++k) mark(role, 16 + k, 0u);
        mark(role, 23, 0u);
        if (I.skip) {
            release_item();
            continue;
        }
        const int h = I.h, rows = I.rows, ntiles = item_tiles;
        const Geom& g = I.g;
        const i32 r0 = I.r0, x_base = I.x_base, t_first = I.t_first;
        const bool active = wrow0 < rows;    // warpgroup-uniform
        const i32 xw_min = x_base + (r0 + wrow0) / G;
        const i32 xw_max = x_base + (r0 + min(wrow0 + 63, rows - 1)) / G;
        // TRIM: whether tile t is the item's last and trimmed for this
        // warpgroup (uniform; evaluated where used, so that no register
        // holds it across the tile loop: the three consumers' entries
        // spilled 8 bytes with a per-item flag).
        auto trim_at = [&](int t) {
            if constexpr (D == 256)
                if (t == 0) return false;  // see TRIM
            return TRIM && (p.variant & 4) == 0 && active && t == ntiles - 1 &&
                   xw_max < (t_first + t) * BN + BN / 2;
        };
        i32 xr[2], xlo[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int row = wrow0 + 16 * warp + gr + 8 * hr;
            xr[hr] = row < rows ? x_base + (r0 + row) / G : -1;  // padding rows see no key
            xlo[hr] = p.window_left >= 0 ? xr[hr] - p.window_left : (i32)0x80000000;
        }

        float o[NO];
#pragma unroll
        for (int i = 0; i < NO; ++i) o[i] = 0.f;
        // TCSUM: the running row sums, an m64n8 accumulator (rows hr 0 / 1 in
        // lacc[0..1] / lacc[2..3], all columns equal).
        float lacc[4] = {0.f, 0.f, 0.f, 0.f};
        // S accumulators: each tile's first S step is write-only (see `qk`);
        // zeroed once per item all the same (without it ptxas spilled in the
        // trace and experiment entries).
        float s[NS];
#pragma unroll
        for (int i = 0; i < NS; ++i) s[i] = 0.f;
        // The trimmed tile's S and P (TRIM): fenced alone, so that the
        // upper half holds nothing live across its GEMMs.
        float(&s_lo)[NS / 2] = reinterpret_cast<float(&)[NS / 2]>(s);
        u32 pa[KSTEPS][4];
#pragma unroll
        for (int i = 0; i < KSTEPS; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) pa[i][e] = 0u;
        float mrow[2] = {PAC_NEG_INF, PAC_NEG_INF};
        float drow[2] = {0.f, 0.f};
        float alpha[2] = {0.f, 0.f};

        // Ping-pong (schedule variant bit 0): the consumers take turns issuing their
        // GEMMs (named barriers 4 + c: "warpgroup c may issue"), so one's softmax
        // runs under the other's GEMMs. Both warpgroups (active or not) take
        // every turn; warpgroup 0 goes first and warpgroup 1 passes no turn after
        // its last. Off by default: on the H200 the free-running consumers were
        // as fast or faster (docs/PERF.md, sessions 3 and 5).
        const bool pingpong = NCW == 2 && (p.variant & 1) != 0;  // two consumers only
        auto turn_take = [&]() { named_sync_if(pingpong, 4 + cw, 256); };
        auto turn_pass = [&](bool last) { named_arrive_if(pingpong && !(cw == 1 && last), 5 - cw, 256); };

        // wgmma descriptors: the low word (start address and leading offset)
        // of one base per operand plus offsets in 16-byte units (addresses stay
        // below 2^18, so the 14-bit start field never carries); the high word
        // (stride offset 1024, 128-byte swizzle) is a constant.
        constexpr u32 DHI = (u32)(sdesc(0, 0, 1024) >> 32);
        auto dsc = [](u32 lo) { return ((u64)DHI << 32) | lo; };
        // Broadcasts (shfl from lane 0) mark a value warp-uniform for ptxas,
        // which then keeps the wgmma descriptors derived from it in uniform
        // registers (else each wgmma pays R2UR moves of both descriptors).
        // 16-bit K/V only: the e4m3 entries ran 2-6% slower with them
        // (PERF.md session 34, H100: FP8 bs 1 x 16384 457 / 466 against
        // 487 / 487 TFLOP/s), the bf16 entries the same.
        auto uni = [](int v) -> int {
            if constexpr (F8) return v;
            else return __shfl_sync(0xffffffffu, v, 0);
        };
        const int qb = uni(nq % QBUF);  // this item's Q buffer (when it loads one)
        const u32 q_lo = (u32)sdesc(base + C::Q_OFF + qb * C::Q_BYTES + wrow0 * 128, 16, 1024);
        const u32 k_lo0 = (u32)sdesc(base + C::K_OFF, 16, 1024);
        const u32 v_lo0 = (u32)sdesc(base + C::V_OFF, C::KV_ATOM, 1024);
        // hb (a literal at every call, folded once the lambda is inlined:
        // NVRTC compiles no generic lambda in device code): true issues the
        // trimmed tile's S (its first BN / 2 keys, m64n(BN/2), into
        // s[0 .. NS / 2); see TRIM), false the whole tile's.
        auto qk = [&](int st, bool hb) {
            if constexpr ((XV & 2) != 0) return;
            wg_fence();
            const u32 kd = k_lo0 + (u32)((uni(st) * C::K_BYTES) >> 4);
            u32 qd0 = q_lo;
            asm volatile("" : "+r"(qd0));  // not hoisted: D / 16 descriptors would stay live
            qd0 = (u32)uni((int)qd0);      // and uniform (see `qb`)
#pragma unroll
            for (int ks = 0; ks < D / 16; ++ks) {
                // K8: steps 0-3 run Q's hi part (the buffer's first atom), 4-7
                // its lo part (the second), each over the e4m3 K tile's
                // 128-byte rows: k32 steps of 32 bytes, as the 16-bit steps.
                const u32 qo = ((ks >> 2) * C::Q_ATOM + (ks & 3) * 32) >> 4;
                const u32 ko = ((K8 ? 0 : (ks >> 2) * C::KV_ATOM) + (ks & 3) * 32) >> 4;
                // The first step is write-only (scale-d 0, s not read: dead
                // since the last P was packed), so its registers are free
                // until here.
                if (TRIM && hb)
                    s_step<MT, BN / 2, K8>(s_lo, dsc(qd0 + qo), dsc(kd + ko), ks == 0);
                else
                    s_step<MT, BN, K8>(s, dsc(qd0 + qo), dsc(kd + ko), ks == 0);
            }
            wg_commit();
        };
        // hb as in qk: the trimmed tile's P V runs its first KSTEPS / 2 steps.
        auto pv = [&](int st, bool hb) {
            if constexpr ((XV & 2) != 0) return;
            const int KSV = TRIM && hb ? KSTEPS / 2 : KSTEPS;
            wg_fence();
            const u32 vd = v_lo0 + (u32)((uni(st) * C::KV_BYTES) >> 4);
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                if (kk >= KSV) break;
                if constexpr (SERIAL) {
                    // P packed in place in s (see rescale_pack).
                    const u32 a[4] = {__float_as_uint(s[4 * kk]), __float_as_uint(s[4 * kk + 1]),
                                      __float_as_uint(s[4 * kk + 2]), __float_as_uint(s[4 * kk + 3])};
                    mma_rs<MT, D>(o, a, dsc(vd + ((kk * 16 * 128) >> 4)), 1);
                    continue;
                }
                mma_rs<MT, D>(o, pa[kk], dsc(vd + ((kk * 16 * 128) >> 4)), 1);
                if constexpr (TCSUM) mma_rs<MT, 8>(lacc, pa[kk], sdesc_noswz(ones_addr, 128, 128), 1);
            }
            wg_commit();
        };
        // Whether tile t needs no element mask for this warpgroup's rows.
        auto tile_full = [&](int t, const u32 (&vmw)[VMW]) {
            const i32 k0 = (t_first + t) * BN;
            bool full = k0 + BN - 1 <= xw_min && (p.window_left < 0 || k0 >= xw_max - p.window_left);
#pragma unroll
            for (int w = 0; w < VMW; ++w) full = full && vmw[w] == 0xffffffffu;
            return full;
        };
        // Mask (edge tiles), running max, exponentials in place (s becomes P in
        // f32) and the row sums of P. With a positive logit scale c the max is
        // taken on raw scores and p = 2^(s c - m) is one FFMA + ex2; otherwise
        // the scores are scaled first. mrow is in scaled (log2) units. The ex2
        // are volatile so that they stay ahead of the wait for P V (they are the
        // work that overlaps the tensor cores).
        // Logit scale of this thread's row hr: scale_log2, for a converted
        // bf16 Q (QCONV) times 2^qs of the row, for K8 2^-e (set after the Q wait).
        const float c = p.scale_log2;
        const bool cpos = c > 0.f;
        float cq[2] = {c, c};
        auto crow = [&](int hr) {
            if constexpr (QCONV) return cq[hr];
            return c;
        };
        float dsum[2] = {0.f, 0.f};
        // hb as in qk: the trimmed tile's softmax reads s[0 .. NS / 2) only
        // (its other keys are past every row of the warpgroup).
        auto softmax = [&](int t, bool full, const u32 (&vmw)[VMW], bool hb) {
            const int NSV = TRIM && hb ? NS / 2 : NS;
            if constexpr ((XV & 1) != 0) {
                alpha[0] = alpha[1] = 1.f;
                return;
            }
            const i32 k0 = (t_first + t) * BN;
            float mx[2] = {PAC_NEG_INF, PAC_NEG_INF};
            bool vall = true;  // every key of the tile valid (warpgroup-uniform)
#pragma unroll
            for (int w = 0; w < VMW; ++w) vall = vall && vmw[w] == 0xffffffffu;
            if (!(F8 && D == 128) && !full && vall && p.window_left < 0) {
                // Causal edge only: key 8 j + 2 qd + e is seen by row hr when
                // 8 j + e <= xr[hr] - k0 - 2 qd (one compare and select a
                // score). Not in the e4m3 D 128 entry, whose 216 consumer
                // registers it overflows.
                const i32 lim[2] = {xr[0] - k0 - 2 * qd, xr[1] - k0 - 2 * qd};
#pragma unroll
                for (int i = 0; i < NS; ++i) {
                    if (i >= NSV) break;
                    const int tk = 8 * (i >> 2) + (i & 1);
                    s[i] = tk <= lim[(i >> 1) & 1] ? s[i] : PAC_NEG_INF;
                }
            } else if (!full) {
                // This thread's key 8 j + 2 qd + e has its valid bit in word
                // 2 (j & 1) + (qd >> 1), bit 16 (qd & 1) + 8 e + (j >> 1)
                // (layout: key_row_of_lane).
                const bool hq = (qd >> 1) != 0;
                const u32 sh = 16u * (u32)(qd & 1);
                const u32 mw[2] = {(hq ? vmw[1] : vmw[0]) >> sh, (hq ? vmw[3] : vmw[2]) >> sh};
#pragma unroll
                for (int i = 0; i < NS; ++i) {
                    if (i >= NSV) break;
                    const int j = i >> 2;
                    const int hr = (i >> 1) & 1;
                    const int e = i & 1;
                    const int tk = 8 * j + 2 * qd + e;
                    const i32 k = k0 + tk;
                    const bool vis = ((mw[j & 1] >> (8 * e + (j >> 1))) & 1u) && k <= xr[hr] && k >= xlo[hr];
                    s[i] = vis ? s[i] : PAC_NEG_INF;
                }
            }
            // Row max and row sum over eight and four independent partials per
            // row (a thread's 32 values of a row in one chain would be a
            // 32-deep dependency of FMNMX / FADD latencies).
            // SERIAL: four partials (registers; three warpgroups hide the latency).
            constexpr int MPN = SERIAL3 ? 4 : 8;
            float mp[2][MPN];
#pragma unroll
            for (int hr = 0; hr < 2; ++hr)
#pragma unroll
                for (int k = 0; k < MPN; ++k) mp[hr][k] = PAC_NEG_INF;
            if (cpos) {
#pragma unroll
                for (int i = 0; i < NS; ++i) {
                    if (i >= NSV) break;
                    float& m = mp[(i >> 1) & 1][(((i >> 2) & 3) | ((i & 1) << 2)) & (MPN - 1)];
                    m = fmaxf(m, s[i]);
                }
            } else {
#pragma unroll
                for (int i = 0; i < NS; ++i) {
                    if (i >= NSV) break;
                    s[i] = s[i] == PAC_NEG_INF ? PAC_NEG_INF : s[i] * crow((i >> 1) & 1);  // masked stays -inf
                    float& m = mp[(i >> 1) & 1][(((i >> 2) & 3) | ((i & 1) << 2)) & (MPN - 1)];
                    m = fmaxf(m, s[i]);
                }
            }
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
#pragma unroll
                for (int w = MPN / 2; w >= 1; w >>= 1)
#pragma unroll
                    for (int k = 0; k < w; ++k) mp[hr][k] = fmaxf(mp[hr][k], mp[hr][k + w]);
                // Rounded up, so that every 2^(s c - m) is at most 1 (an FFMA
                // keeps the exact product s c: with m rounded to nearest the
                // max's own exponent is +-ulp(m) / 2, which overflows once
                // |m| >= 2^31). Its weight is then 2^-e, 0 <= e <= ulp(m), the
                // same factor for every key of the row and tile; it flushes to
                // zero only for |m| >= 2^30 in log2 units, logits far beyond
                // any model's (docs/DESIGN.md, "numeric range").
                mx[hr] = cpos ? __fmul_ru(mp[hr][0], crow(hr)) : mp[hr][0];  // -inf stays -inf
            }
            row_max_update(mx, mrow, alpha);
            // SX, EXT: this warpgroup's turn for its exponentials (SX passes
            // it after rescale_pack, see the serial tile loop; EXT after the
            // exponentials, below). ptxas moves register arithmetic across a
            // bar.sync (seen in SASS: a third of the MUFU.EX2 above it), not
            // shared-memory loads: the max plus a +0 read from shared memory
            // after it keeps every exponential inside the turn (x + 0 = x,
            // -inf stays -inf).
            if constexpr (PSUM) {
                if constexpr (SX) named_sync_if(true, 4 + cw, 256);
                if constexpr (EXT) named_sync_if(true, 8 + cw, 256);
                u32 zw;
                asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(zw) : "r"(pin_addr) : "memory");
                // SX: the word is +0; EXT: the XOR of the last turn's
                // exponentials, whose mantissa bits as a float (a zero or
                // subnormal) times 0 are +0 (in PTX, which the front end
                // cannot fold away).
                float z = __uint_as_float(EXT ? zw & 0x007fffffu : zw);
                if constexpr (EXT) asm("mul.f32 %0, %0, 0f00000000;" : "+f"(z));
                mx[0] += z;
                mx[1] += z;
            }
            // Scores still raw (cpos) or already scaled.
            const float cs[2] = {cpos ? crow(0) : 1.f, cpos ? crow(1) : 1.f};
            float sp[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
            u32 xb[4] = {0u, 0u, 0u, 0u};
#pragma unroll
            for (int i = 0; i < NS; ++i) {
                if (i >= NSV) break;
                const int hr = (i >> 1) & 1;
                const float x = fmaf(s[i], cs[hr], -mx[hr]);
                // POLY: one score in four on the FMA pipe (ex2_poly), the
                // rest on MUFU, whose issue spacing paces the loop.
                s[i] = POLY && (i & 3) == 3 ? ex2_poly(x) : ex2f(x);
                if constexpr (TCSUM) {
                    if (i & 1) xb[(i >> 1) & 3] ^= __float_as_uint(s[i - 1]) ^ __float_as_uint(s[i]);
                } else if constexpr (!PSUM) {
                    sp[hr][(i >> 2) & 3] += s[i];
                }
            }
            // SX, EXT: the row sums come from the packed P later (`psum`),
            // so that no FADD waits for an exponential here. EXT passes the
            // turn here. ptxas sinks register arithmetic below a bar.arrive
            // and a wgmma wait (SASS: 63 of the 64 MUFU.EX2 after both), not
            // a shared-memory store: the XOR of every exponential's bits,
            // stored to the pin word, keeps them inside the turn; the next
            // turn reads that word as a +0 (its mantissa bits as a float,
            // a zero or subnormal, times 0).
            if constexpr (EXT) {
                u32 f[4] = {0u, 0u, 0u, 0u};
#pragma unroll
                for (int i = 0; i < NS / 2; ++i)
                    f[i & 3] ^= __float_as_uint(s[i]) ^ __float_as_uint(s[i + NS / 2]);
                asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(pin_addr), "r"((f[0] ^ f[1]) ^ (f[2] ^ f[3]))
                             : "memory");
                named_arrive_if(!(cw == 1 && t == ntiles - 1), 9 - cw, 256);
            }
            if constexpr (PSUM) return;
            if constexpr (TCSUM) {
                dsum[0] = __uint_as_float((xb[0] ^ xb[1]) ^ (xb[2] ^ xb[3]));
                dsum[1] = 0.f;
            } else {
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) dsum[hr] = (sp[hr][0] + sp[hr][1]) + (sp[hr][2] + sp[hr][3]);
            }
            // ptxas moves the wait for P V above independent arithmetic, which
            // would put every exponential after it (no overlap with the tensor
            // cores); it keeps shared-memory stores on their side of the wait,
            // so a store of a value that depends on all of them pins them here.
            asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(pin_addr), "f"(dsum[0] + dsum[1]) : "memory");
        };
        // O *= alpha, alpha of the last softmax, before the P V that adds
        // that tile. Late (default): after the wait for P V, skipped when no
        // row max of the warp moved. EARLY (XV & 32, FA3's placement):
        // between the issue of S_t and of P_{t-1} V_{t-1}, so that it runs
        // while S_t is on the tensor cores; branch-free there (a branch
        // between two wgmmas would serialize them).
        auto rescale_o = [&]() {
            if (EARLY || __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
                float a[2] = {alpha[0], alpha[1]};
                if constexpr (EARLY) {
                    // ptxas hoists independent arithmetic above the S
                    // wgmmas (seen in SASS); a factor made from a clock read
                    // taken here keeps the multiplies after the S issue:
                    // one = min(a float in [1, 2) built from the clock, 1) is
                    // exactly 1, and ptxas cannot fold it.
                    const u32 ck = clk32();
                    const float one = fminf(__uint_as_float((ck & 0x007fffffu) | 0x3f800000u), 1.f);
                    a[0] *= one;
                    a[1] *= one;
                }
#pragma unroll
                for (int i = 0; i < NO; ++i) o[i] *= a[(i >> 1) & 1];
                if constexpr (TCSUM) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) lacc[i] *= a[(i >> 1) & 1];
                }
            }
        };
        // P = 16-bit S; running row sums (late placement: O *= alpha first).
        // hb as in qk: the trimmed tile packs its first KSTEPS / 2 steps and
        // zeroes the others' P (which the CUDA-core P V of a tile with
        // non-finite V reads: it skips zero weights).
        auto rescale_pack = [&](bool hb) {
            const int KSV = TRIM && hb ? KSTEPS / 2 : KSTEPS;
            if constexpr (!EARLY) rescale_o();
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = 8 * kk + 2 * e;
                    if (kk >= KSV) {
                        if constexpr (SERIAL)
                            s[4 * kk + e] = 0.f;
                        else
                            pa[kk][e] = 0u;
                        continue;
                    }
                    // SERIAL: P's step kk lands in s[4 kk .. 4 kk + 3]
                    // (in increasing order each source is read before it is
                    // overwritten), so P takes no registers of its own.
                    if constexpr (SERIAL)
                        s[4 * kk + e] = __uint_as_float(pack2<MT>(s[i], s[i + 1]));
                    else
                        pa[kk][e] = pack2<MT>(s[i], s[i + 1]);
                }
            }
            if constexpr (!TCSUM && !PSUM) {
                drow[0] = drow[0] * alpha[0] + dsum[0];
                drow[1] = drow[1] * alpha[1] + dsum[1];
            }
        };
        // SX, EXT: the running row sums from the packed P (SX: P's step kk
        // in s[4 kk .. 4 kk + 3], EXT: in pa[kk]; word e holds two keys of row
        // e & 1), before the P V wgmma that reads those registers is issued
        // (PTX leaves a read of an in-flight wgmma's A registers undefined).
        // The sum is of the 16-bit P that P V multiplies (the default sums
        // the f32 exponentials).
        auto psum = [&]() {
            if constexpr (PSUM) {
                float sq[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
                for (int kk = 0; kk < KSTEPS; ++kk)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const u32 w = SERIAL ? __float_as_uint(s[4 * kk + e]) : pa[kk][e];
                        const float lo = MT == 0 ? __uint_as_float(w << 16) : f16_to_f32((u16)(w & 0xffffu));
                        const float hi = MT == 0 ? __uint_as_float(w & 0xffff0000u) : f16_to_f32((u16)(w >> 16));
                        sq[e & 1][kk & 3] += lo + hi;
                    }
#pragma unroll
                for (int hr = 0; hr < 2; ++hr)
                    drow[hr] = drow[hr] * alpha[hr] + ((sq[hr][0] + sq[hr][1]) + (sq[hr][2] + sq[hr][3]));
            }
        };
        // Whether V of stage st holds a non-finite value (warpgroup-wide).
        // Only keys that some row of the warpgroup does not see can carry a
        // non-finite value into it (0 * NaN): keys outside [a, b], the keys
        // every row sees (a = xw_max - window_left, b = xw_min). The gather
        // zero-fills keys outside the item's [k_lo, k_hi) and on bad pages;
        // TMA reads whole pages, so there the whole tile outside [a, b] is
        // scanned.
        auto v_nonfinite = [&](int st, int t) {
            const u8* v = smem + C::V_OFF + st * C::KV_BYTES;
            const i32 k0 = (t_first + t) * BN;
            const i32 lo = tma ? k0 : max(k0, I.k_lo);
            const i32 hi = tma ? k0 + BN : min(k0 + BN, I.k_hi);
            const i32 b = xw_min;
            const i32 a = p.window_left >= 0 ? xw_max - p.window_left : lo;
            // Two ranges of keys, [lo, min(hi, a)) and [max(lo, b + 1), hi)
            // (one, [lo, hi), when no key is seen by every row).
            const bool split = a <= b;
            const i32 r_end[2] = {split ? min(hi, a) : hi, hi};
            const i32 r_beg[2] = {lo, split ? max(lo, b + 1) : hi};
            // Every pass loads (branch-free; rows outside both ranges count
            // nothing): a 16-bit value is non-finite when its exponent field
            // is all ones, i.e. when (w & E) + (lowest bit of E) sets bit 15.
            constexpr int RPP = 128 / CPR;  // key rows per pass
            constexpr u32 E2 = MT == 0 ? 0x7F807F80u : 0x7C007C00u;
            constexpr u32 INC2 = MT == 0 ? 0x00800080u : 0x04000400u;
            const int ch = ct % CPR;
            const u32 col = (u32)((ch >> 3) * C::KV_ATOM + (ch & 7) * 16);
            const int r0t = ct / CPR;
            const i32 b0 = r_beg[0] - k0, e0 = r_end[0] - k0, b1 = r_beg[1] - k0, e1 = r_end[1] - k0;
            u32 acc = 0;
            constexpr int SCAN_UNROLL = F8 && D == 128 ? 2 : 4;  // loads in flight (e4m3 D 128: registers)
            // Only the passes that hold a row of either range (warpgroup-
            // uniform bounds): on a causal diagonal tile a few rows past the
            // warpgroup's first position, not the whole tile.
            const int rb = min(b0 < e0 ? b0 : BN, b1 < e1 ? b1 : BN);
            const int re = max(b0 < e0 ? e0 : 0, b1 < e1 ? e1 : 0);
            const int i_end = re > rb ? (re + RPP - 1) / RPP : 0;
#pragma unroll SCAN_UNROLL
            for (int i = rb / RPP; i < i_end; ++i) {
                const int r = r0t + i * RPP;
                const uint4 u = *reinterpret_cast<const uint4*>(v + col + r * 128);
                const u32 t = (((u.x & E2) + INC2) | ((u.y & E2) + INC2)) | (((u.z & E2) + INC2) | ((u.w & E2) + INC2));
                const bool in = (r >= b0 && r < e0) || (r >= b1 && r < e1);
                acc |= in ? t : 0u;
            }
            if constexpr (NOSCAN) return false;
            return named_or(2 + cw, 128, (acc & 0x80008000u) != 0u);
        };
        // O += P V for stage st on CUDA cores (tiles with masked keys and non-finite V).
        auto pv_slow = [&](int st) {
            const u8* v = smem + C::V_OFF + st * C::KV_BYTES;
            if constexpr (SERIAL) {
#pragma unroll
                for (int kk = 0; kk < KSTEPS; ++kk)
#pragma unroll
                    for (int e = 0; e < 4; ++e) pa[kk][e] = __float_as_uint(s[4 * kk + e]);
            }
            pv_scalar<MT, BN, D>(
                pa, lane, [&](int j, int e) -> float& { return o[4 * j + e]; },
                [&](int key, int ch) { return v + swz(key, ch, C::KV_ATOM); });
            if constexpr (TCSUM) {
                // No wgmma on this tile: its row sums from the packed P
                // (pa[kk][e] holds two scores of row e & 1), over the quad.
                float rs[2] = {0.f, 0.f};
#pragma unroll
                for (int kk = 0; kk < KSTEPS; ++kk)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const u32 w = pa[kk][e];
                        const float lo = MT == 0 ? __uint_as_float(w << 16) : f16_to_f32((u16)(w & 0xffffu));
                        const float hi = MT == 0 ? __uint_as_float(w & 0xffff0000u) : f16_to_f32((u16)(w >> 16));
                        rs[e & 1] += lo + hi;
                    }
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    rs[hr] += __shfl_xor_sync(0xffffffffu, rs[hr], 1);
                    rs[hr] += __shfl_xor_sync(0xffffffffu, rs[hr], 2);
                    lacc[2 * hr] += rs[hr];
                    lacc[2 * hr + 1] += rs[hr];
                }
            }
        };

        if (ntiles > 0) {
            mark(role, 22, tnow());
            mbar_wait(bar_q + 8 * qb, (u32)((nq / QBUF) & 1));
            mark(role, 2, tnow());
            if constexpr (QCONV) {
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const int row = wrow0 + 16 * warp + gr + 8 * hr;
                    // qs >= 0 (QCONV), or -e as a signed byte (K8).
                    const u8 x = smem[C::QX_OFF + qb * BM + row];
                    cq[hr] *= __int_as_float((127 + (K8 ? (int)(i8)x : (int)x)) << 23);
                }
            }
            u32 vmw[VMW];
            if constexpr (SERIAL) {
                // ---- every tile: S_t, softmax, P_t V_t ----
                // SX: the turns of the exponential sections (taken in
                // `softmax`, passed after rescale_pack) alternate, warpgroup
                // 0 first in each item; both warpgroups (active or not) take
                // every turn and warpgroup 1 passes none after its last.
                if constexpr (SX) named_arrive_if(cw == 1, 4, 256);
#pragma unroll 1
                for (int t = 0; t < ntiles; ++t) {
                    const int st = kslot(t);
                    mbar_wait(bar_fk + 8 * st, kpar(t));
#pragma unroll
                    for (int w = 0; w < VMW; ++w) vmw[w] = vm_s[st * VMW + w];
                    const bool full = tile_full(t, vmw);
                    // TRIM: each form waits for its own S (no merge with a
                    // wgmma in flight).
                    const bool half = trim_at(t);
                    if (half) {
                        qk(st, true);
                        wg_wait<0>();
                        fence_regs(s_lo);
                    } else if (active) {
                        qk(st, false);
                        wg_wait<0>();
                        fence_regs(s);
                    }
                    mbar_arrive(bar_ek + 8 * st);
                    // By now the last item's TMA stores have long read their rows.
                    if (t == 0) release_o();
                    if (half) {
                        softmax(t, full, vmw, true);
                        rescale_pack(true);
                    } else if (active) {
                        softmax(t, full, vmw, false);
                        rescale_pack(false);
                    } else if constexpr (SX) {
                        named_sync_if(true, 4 + cw, 256);
                    }
                    if constexpr (SX) named_arrive_if(!(cw == 1 && t == ntiles - 1), 5 - cw, 256);
                    const int sv = vslot(t);
                    mbar_wait(bar_fv + 8 * sv, vpar(t));
                    const bool slow = active && !full && v_nonfinite(sv, t);
                    if (slow) {
                        psum();
                        pv_slow(sv);
                    } else if (half) {
                        pv(sv, true);
                        wg_wait<0>();
                        fence_regs(o);
                        fence_regs(s_lo);  // P, read by the P V wgmma
                    } else if (active) {
                        psum();
                        pv(sv, false);
                        wg_wait<0>();
                        fence_regs(o);
                        fence_regs(s);  // P, read by the P V wgmma
                    }
                    mbar_arrive(bar_ev + 8 * sv);
                }
            } else {
            // ---- tile 0 ----
            mbar_wait(bar_fk + 8 * kslot(0), kpar(0));
#pragma unroll
            for (int w = 0; w < VMW; ++w) vmw[w] = vm_s[kslot(0) * VMW + w];
            mark(role, 3, tnow());
            bool prev_full = tile_full(0, vmw);
            named_arrive_if(pingpong && cw == 1, 4, 256);  // warpgroup 0 issues first
            // EXT: warpgroup 0 takes the first exponential turn of the item;
            // an idle warpgroup takes and passes its turns all the same.
            if constexpr (EXT) named_arrive_if(cw == 1, 8, 256);
            auto ext_idle_turn = [&](int t) {
                if constexpr (EXT) {
                    named_sync_if(true, 8 + cw, 256);
                    named_arrive_if(!(cw == 1 && t == ntiles - 1), 9 - cw, 256);
                }
            };
            // TRIM: whether this warpgroup ran the item's last tile trimmed
            // (its only tile here; in the loop, unless that tile's
            // iteration takes the CUDA-core P V path). Each form issues and
            // waits for its own GEMMs (no merge with a wgmma in flight).
            bool lh = !QCONV && trim_at(0);
            turn_take();
            if (lh) {
                qk(kslot(0), true);
                turn_pass(false);
                wg_wait<0>();
                fence_regs(s_lo);
                mark(role, 4, tnow());
            } else if (active) {
                qk(kslot(0), false);
                turn_pass(false);
                wg_wait<0>();
                fence_regs(s);
                mark(role, 4, tnow());
            } else {
                turn_pass(false);
            }
            mbar_arrive(bar_ek + 8 * kslot(0));
            // By now the last item's TMA stores have long read their rows.
            release_o();
            // Without STAGE_O, Q is free for the next item after this
            // warpgroup's last S (an idle warpgroup reads no Q); with it, after
            // the epilogue.
            mbar_arrive_if(!C::STAGE_O && (!active || ntiles == 1), bar_qe + 8 * qb);
            if (lh) {
                softmax(0, prev_full, vmw, true);
                rescale_pack(true);
                mark(role, 5, tnow());
            } else if (active) {
                softmax(0, prev_full, vmw, false);
                rescale_pack(false);
                mark(role, 5, tnow());
            } else {
                ext_idle_turn(0);
            }
            // ---- tiles 1 .. ntiles - 1: S_t overlaps P_{t-1} V_{t-1} ----
#pragma unroll 1
            for (int t = 1; t < ntiles; ++t) {
                const int st = kslot(t);      // K ring slot of tile t
                const int sp = vslot(t - 1);  // V ring slot of tile t - 1
                const u32 tkv = tnow();       // trace: the K / V waits (event 23)
                mbar_wait(bar_fk + 8 * st, kpar(t));
                if (t == 1) mark(role, 10, tnow());
#pragma unroll
                for (int w = 0; w < VMW; ++w) vmw[w] = vm_s[st * VMW + w];
                const bool full = tile_full(t, vmw);
                mbar_wait(bar_fv + 8 * sp, vpar(t - 1));
                if (t == 1) mark(role, 11, tnow());
                mark_add(role, 23, tnow() - tkv);
                const bool slow = active && !prev_full && v_nonfinite(sp, t - 1);
                if (t == 1) mark(role, 14, tnow());
                // The two paths never merge while a wgmma is in flight (ptxas
                // would serialize every wgmma of the kernel otherwise).
                // S_t beside P_{t-1} V_{t-1} on the tensor cores (hb: tile t
                // trimmed, see TRIM; tile t - 1 is never the last).
                auto fast_tile = [&](bool hb) {
                    turn_take();
                    u32 tlap = tnow();  // trace: the phase boundaries, one lap at a time
                    auto lap = [&](int k) {
                        if constexpr (TR) {
                            const u32 now = tnow();
                            mark_add(role, 16 + k, now - tlap);
                            tlap = now;
                        }
                    };
                    if (t == 2) mark(role, 21, tlap);
                    qk(st, hb);
                    if constexpr (EARLY) rescale_o();  // alpha of tile t - 1, under S_t
                    psum();  // P_{t-1}, with alpha of tile t - 1, under S_t
                    pv(sp, false);
                    turn_pass(false);
                    lap(0);
                    wg_wait<1>();
                    if (hb)
                        fence_regs(s_lo);
                    else
                        fence_regs(s);
                    lap(1);
                    mbar_arrive(bar_ek + 8 * st);
                    mbar_arrive_if(!C::STAGE_O && t == ntiles - 1, bar_qe + 8 * qb);
                    softmax(t, full, vmw, hb);
                    lap(2);
                    wg_wait<0>();
                    fence_regs(o);
                    if constexpr (TCSUM) fence_regs(lacc);
                    fence_regs(pa);
                    lap(3);
                    mbar_arrive(bar_ev + 8 * sp);
                    rescale_pack(hb);
                    lap(4);
                };
                if (slow) {
                    turn_take();
                    qk(st, false);
                    if constexpr (EARLY) rescale_o();  // alpha of tile t - 1, before its P V
                    turn_pass(false);
                    psum();  // P_{t-1}, with alpha of tile t - 1
                    wg_wait<0>();
                    fence_regs(s);
                    mbar_arrive(bar_ek + 8 * st);
                    mbar_arrive_if(!C::STAGE_O && t == ntiles - 1, bar_qe + 8 * qb);
                    softmax(t, full, vmw, false);
                    pv_slow(sp);
                    mbar_arrive(bar_ev + 8 * sp);
                    rescale_pack(false);
                } else if (trim_at(t)) {
                    fast_tile(true);
                    lh = true;
                } else if (active) {
                    fast_tile(false);
                } else {
                    turn_take();
                    turn_pass(false);
                    mbar_arrive(bar_ek + 8 * st);
                    mbar_arrive(bar_ev + 8 * sp);
                    ext_idle_turn(t);
                }
                prev_full = full;
            }
            // ---- last P V ----
            mark(role, 6, tnow());
            const int sl = vslot(ntiles - 1);
            mbar_wait(bar_fv + 8 * sl, vpar(ntiles - 1));
            mark(role, 7, tnow());
            const bool slow = active && !prev_full && v_nonfinite(sl, ntiles - 1);
            mark(role, 15, tnow());
            if (slow) {
                turn_take();
                turn_pass(true);
                if constexpr (EARLY) rescale_o();
                psum();
                pv_slow(sl);
            } else if (active) {
                auto last_pv = [&](bool hb) {
                    turn_take();
                    if constexpr (EARLY) rescale_o();
                    psum();
                    pv(sl, hb);
                    turn_pass(true);
                    wg_wait<0>();
                    fence_regs(o);
                    if constexpr (TCSUM) fence_regs(lacc);
                    fence_regs(pa);
                };
                // D 256: the trim from the geometry (a flag across the loop
                // spilled). Where the loop's slow path ran the last tile
                // whole, its P past the tile's middle is exact zeros (those
                // keys are causally masked for every row of the warpgroup)
                // and its V is finite (else the slow last P V above), so
                // leaving those steps out changes no bit.
                if (D == 256 ? trim_at(ntiles - 1) : lh)
                    last_pv(true);
                else
                    last_pv(false);
            } else {
                turn_take();
                turn_pass(true);
            }
            mbar_arrive(bar_ev + 8 * sl);
            mark(role, 8, tnow());
            }  // !SERIAL
            if constexpr (TCSUM) {
                // The epilogue sums a thread's partial over its quad; these
                // are whole rows already: a quarter each (exact, a power of 2).
                drow[0] = 0.25f * lacc[0];
                drow[1] = 0.25f * lacc[2];
            }
        }
        // ---- epilogue ----
        // Row hr of this thread in the warpgroup's 64. D 256: from a fresh
        // thread index (opaque); ptxas kept the item start's row + 8 across
        // the tile loop beside O's 128 registers (a spill). The other entries
        // keep the row as it is (the D 64 entries spilled 4 bytes with the
        // fresh index).
        auto erow = [&](int hr) -> int {
            if constexpr (D == 256) {
                u32 tv;
                asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tv));
                return wrow0 + 16 * (int)((tv & 127u) >> 5) + (int)((tv & 31u) >> 2) + 8 * hr;
            } else {
                return wrow0 + 16 * warp + gr + 8 * hr;
            }
        };
        if (C::STAGE_O && ntiles > 0 && p.kv_splits == 1) {
            // Each thread scales its two rows' columns into this warpgroup's
            // rows of the Q buffer (the operand layout, conflict-free), then
            // the warpgroup writes whole rows: thread ct copies 16-byte chunk
            // ct % CPR of rows ct / CPR + ORS i (128 / CPR consecutive lanes
            // per row: contiguous row segments). Rows past `rows` are not
            // written. The Q buffer is released once its rows are read.
            const u32 ob = base + C::Q_OFF + qb * C::Q_BYTES;
            // TMA store (p.o_tma: the launcher's tensor map of `out`, dims
            // [D, Hq, tokens], box [64, G, 64 / G], G | 64): a warpgroup whose
            // 64 rows are all the item's writes them as whole tokens of G
            // heads, D / 64 boxes from its staged rows (the box's smem layout
            // is the operand layout: row = token · G + head, 128-byte
            // swizzle). Its thread 0 issues them and releases the Q buffer
            // once they have read the rows, after its next item's first S
            // (o_pend); the other threads release it now. A partial
            // warpgroup (the request's last tile) stores by threads.
            bool defer = false;  // this thread's TMA stores release the Q buffer later (o_pend)
            bool lead_arrived = false;  // one Q buffer: this thread arrived after its stores' reads
            // D 256: the item's rows, first row and head read again from its
            // published geometry (as in the epilogue by threads below) and
            // the row from erow: ptxas kept them across the tile loop beside
            // O's 128 registers (spills).
            const int rows_e = D == 256 ? I.rows : rows;
            const i32 r0_e = D == 256 ? I.r0 : r0;
            const int h_e = D == 256 ? I.h : h;
            // The row LSE (LSE entries; lane qd 0 of each row's four). Not
            // in the three consumers' entries (D 64 16-bit), where it
            // spilled (152 registers): the launcher runs LSE launches there
            // on the duo entry.
            if (LSE && !SERIAL3 && active && p.lse != nullptr) {
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    float den = drow[hr];
                    den += __shfl_xor_sync(0xffffffffu, den, 1);
                    den += __shfl_xor_sync(0xffffffffu, den, 2);
                    const int row = erow(hr);
                    const int qh = h_e * G + (r0_e + row) % G;
                    if (qd == 0 && row < rows_e)
                        p.lse[(i64)(g.row_start + (r0_e + row) / G) * p.lse_stride_tok + qh] =
                            row_lse(den, mrow[hr], p.sinks, qh);
                }
            }
            if (active) {
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    float den = drow[hr];
                    den += __shfl_xor_sync(0xffffffffu, den, 1);
                    den += __shfl_xor_sync(0xffffffffu, den, 2);
                    const int row = erow(hr);
                    const int qh = h_e * G + (r0_e + row) % G;
                    const float scale = row < rows_e ? out_scale(den, mrow[hr], p.sinks, qh, p.bmm2_scale) : 0.f;
#pragma unroll
                    for (int n = 0; n < D / 8; ++n) {
                        const u32 v = pack2<QT>(o[4 * n + 2 * hr] * scale, o[4 * n + 2 * hr + 1] * scale);
                        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(ob + swz(row, n, C::Q_ATOM) + 4u * (u32)qd), "r"(v)
                                     : "memory");
                    }
                }
                if (OTMA && p.o_tma != 0) fence_proxy_async();  // the staged rows, before a TMA store reads them
                named_sync_if(true, 6 + cw, 128);
                if (OTMA && p.o_tma != 0 && !NOSTORE && wrow0 + 64 <= rows_e) {
                    const bool lead = ct == 0;
                    const int tok = g.row_start + (r0_e + wrow0) / G;
                    u64 map;
                    asm volatile("ld.shared.u64 %0, [%1];\n" : "=l"(map) : "r"(base + C::OMAP_OFF));
#pragma unroll
                    for (int a = 0; a < D / 64; ++a)
                        tma_store_3d_if(lead, map, ob + a * C::Q_ATOM + wrow0 * 128, 64 * a, h_e * G, tok);
                    bulk_commit_if(lead);
                    // One Q buffer (D 256): the next item's Q waits for
                    // these stores to read the rows, so no deferral (the
                    // next item's first S would wait for that Q).
                    defer = lead && C::QBUF > 1;
                    if constexpr (C::QBUF == 1) bulk_wait_read_arrive_if(lead, bar_qe + 8 * qb);
                    if (C::QBUF == 1 && lead) lead_arrived = true;
                } else {
                constexpr int ORS = 128 / CPR;  // rows per pass
                const int ch = ct % CPR;
                int rr = ct / CPR;  // row of the warpgroup's 64
                int rg = r0_e + wrow0 + rr;
                int j = rg / G;
                int gq = rg - j * G;
                const int sj = ORS / G, sg = ORS - (ORS / G) * G;
#pragma unroll
                for (int i = 0; i < 64 / ORS; ++i, rr += ORS) {
                    if (wrow0 + rr < rows_e) {
                        uint4 v;
                        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                                     : "r"(ob + swz(wrow0 + rr, ch, C::Q_ATOM))
                                     : "memory");
                        u16* dst = p.out + (i64)(g.row_start + j) * p.o_stride_tok + (i64)(h_e * G + gq) * p.o_stride_head +
                                   ch * 8;
                        // One 16-byte store (a C++ uint4 store of these asm
                        // outputs compiled to four 4-byte stores).
                        if (!NOSTORE)
                            asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(v.x), "r"(v.y),
                                         "r"(v.z), "r"(v.w)
                                         : "memory");
                    }
                    j += sj;
                    gq += sg;
                    if (gq >= G) {
                        gq -= G;
                        ++j;
                    }
                }
                }  // stores by threads
            }
            if constexpr (OTMA) o_pend = defer ? bar_qe + 8 * qb : 0u;
            mbar_arrive_if(!defer && !lead_arrived, bar_qe + 8 * qb);
        } else {
#pragma unroll
        for (int hr = 0; hr < 2 && active; ++hr) {
            float den = drow[hr];
            den += __shfl_xor_sync(0xffffffffu, den, 1);
            den += __shfl_xor_sync(0xffffffffu, den, 2);
            const int row = erow(hr);  // see erow
            // Compared here (opaque), not kept as a flag from the item's start
            // (ptxas spilled that flag).
            // D 256: the item's rows, head and first row read again from its
            // published geometry (I, shared memory; reloaded after the
            // loop's barriers), not held across the tile loop (O: 128
            // registers; ptxas spilled the copies).
            int rows_v = D == 256 ? I.rows : rows;
            asm volatile("" : "+r"(rows_v));
            if (row >= rows_v) continue;
            if (p.kv_splits > 1) {
                // Split KV: this chunk's unnormalized row, its max and sum.
                const i64 prow = (i64)it * BM + row;
                float* po = p.partial + prow * D + 2 * qd;
#pragma unroll
                for (int n = 0; n < D / 8; ++n)
                    *reinterpret_cast<float2*>(po + 8 * n) = make_float2(o[4 * n + 2 * hr], o[4 * n + 2 * hr + 1]);
                if (qd == 0) {
                    float* pml = p.partial + (i64)items * BM * D + prow * 2;
                    *reinterpret_cast<float2*>(pml) = make_float2(mrow[hr], den);
                }
                continue;
            }
            const int rg = (D == 256 ? I.r0 : r0) + row;
            const int j = rg / G;
            const int qh = (D == 256 ? I.h : h) * G + (rg - j * G);
            const float scale = out_scale(den, mrow[hr], p.sinks, qh, p.bmm2_scale);
            // The row LSE (LSE entries; not the three consumers', see the
            // staged epilogue). With the staged epilogue this path writes
            // only rows that see no key (den 0: -inf); split chunks went on
            // above (the merge entry writes their LSE).
            if (LSE && !SERIAL3 && p.lse != nullptr && qd == 0)
                p.lse[(i64)(g.row_start + j) * p.lse_stride_tok + qh] = row_lse(den, mrow[hr], p.sinks, qh);
            u16* dst = p.out + (i64)(g.row_start + j) * p.o_stride_tok + (i64)qh * p.o_stride_head + 2 * qd;
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                *reinterpret_cast<u32*>(dst + 8 * n) = pack2<QT>(o[4 * n + 2 * hr] * scale, o[4 * n + 2 * hr + 1] * scale);
            }
        }
        if (C::STAGE_O && ntiles > 0) mbar_arrive(bar_qe + 8 * qb);  // split KV: the partial rows were written
        }
        release_item();
        mark(role, 9, tnow());
        T0 += ntiles;
        if (ntiles > 0) ++nq;
    }  // items
}

// Split KV: combines the kv_splits partial rows of work item blockIdx.x (in
// the split-free item order) into the output, the way the kernel's own
// epilogue finishes a row: m = max_s m_s, den = sum_s l_s 2^(m_s - m),
// O = sum_s O_s 2^(m_s - m) * out_scale(den, m) (sinks join once here; a row
// no split saw a key gets zeros). Rows of skipped requests and rows past a
// request's rows stay untouched. 128 threads: warp w takes rows w, w + 4, ...,
// lane l columns 2 l + 64 c.
template <int QT, int D, bool F8>
MHA_KIT_DEVICE void context_sm90_merge_body(const ContextParams& p) {
    constexpr int BN = Cfg<D, F8>::BN;
    constexpr int BM = Cfg<D, F8>::BM;
    const int S = p.kv_splits;
    const int units = p.q_tiles * S * p.num_kv_heads * p.bs;
    const int x = (int)blockIdx.x % p.q_tiles;
    const int hb = (int)blockIdx.x / p.q_tiles;
    const int u0 = x + p.q_tiles * S * hb;  // split 0 of the item
    const Item I = item_geom<BN, BM>(p, u0, false);
    if (I.skip) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float* ml = p.partial + (i64)units * BM * D;
    for (int row = warp; row < I.rows; row += 4) {
        float m = PAC_NEG_INF;
        for (int s = 0; s < S; ++s) m = fmaxf(m, ml[((i64)(u0 + s * p.q_tiles) * BM + row) * 2]);
        const float msafe = m == PAC_NEG_INF ? 0.f : m;
        float den = 0.f;
        float acc[D / 32];
#pragma unroll
        for (int c = 0; c < D / 32; ++c) acc[c] = 0.f;
        for (int s = 0; s < S; ++s) {
            const i64 prow = (i64)(u0 + s * p.q_tiles) * BM + row;
            const float2 v = *reinterpret_cast<const float2*>(ml + prow * 2);
            if (v.y == 0.f) continue;  // no key of this row in the chunk (its O is 0)
            const float w = ex2(v.x - msafe);
            den += v.y * w;
            const float* po = p.partial + prow * D + 2 * lane;
#pragma unroll
            for (int c = 0; c < D / 64; ++c) {
                const float2 o = *reinterpret_cast<const float2*>(po + 64 * c);
                acc[2 * c] += o.x * w;
                acc[2 * c + 1] += o.y * w;
            }
        }
        const int rg = I.r0 + row;
        const int j = rg / p.group;
        const int qh = I.h * p.group + (rg - j * p.group);
        const float scale = out_scale(den, m, p.sinks, qh, p.bmm2_scale);
        if (p.lse != nullptr && lane == 0)
            p.lse[(i64)(I.g.row_start + j) * p.lse_stride_tok + qh] = row_lse(den, m, p.sinks, qh);
        u16* dst = p.out + (i64)(I.g.row_start + j) * p.o_stride_tok + (i64)qh * p.o_stride_head + 2 * lane;
#pragma unroll
        for (int c = 0; c < D / 64; ++c)
            *reinterpret_cast<u32*>(dst + 64 * c) = pack2<QT>(acc[2 * c] * scale, acc[2 * c + 1] * scale);
    }
}

}  // namespace pas

// Split-KV merge entries: paged_attention_context_sm90_merge_{q}_kv_{kv}_d{D}
// (the work items' rows depend on the KV dtype: Cfg::BM), grid q_tiles *
// num_kv_heads * bs, 128 threads.
#define PAS_MERGE_ENTRY(QN, QT, KN, F8, D)                                                        \
    extern "C" __global__ void __launch_bounds__(128)                                             \
        paged_attention_context_sm90_merge_##QN##_kv_##KN##_d##D(const ContextParams p) {         \
        pas::context_sm90_merge_body<QT, D, F8>(p);                                               \
    }
PAS_MERGE_ENTRY(bf16, 0, bf16, false, 64)
PAS_MERGE_ENTRY(bf16, 0, bf16, false, 128)
PAS_MERGE_ENTRY(f16, 1, f16, false, 64)
PAS_MERGE_ENTRY(f16, 1, f16, false, 128)
PAS_MERGE_ENTRY(bf16, 0, e4m3, true, 64)
PAS_MERGE_ENTRY(bf16, 0, e4m3, true, 128)
PAS_MERGE_ENTRY(f16, 1, e4m3, true, 64)
PAS_MERGE_ENTRY(f16, 1, e4m3, true, 128)

// One sm_90a entry NAME: context_sm90_body<QT, D, XV, F8, DUO, LSE> with the
// block size of its Cfg and Cfg::CTAS resident CTAs per SM.
#define PAS_ENTRY_AT(NAME, QT, D, XV, F8, DUO, LSE)                                                \
    extern "C" __global__ void __launch_bounds__(pas::Cfg<D, F8, false, DUO>::NTHREADS,            \
                                                 pas::Cfg<D, F8, false, DUO>::CTAS)                \
        NAME(const ContextParams p, const __grid_constant__ pas::TmaMap tmap_k,                    \
             const __grid_constant__ pas::TmaMap tmap_v, const __grid_constant__ pas::TmaMap tmap_o,   \
             const __grid_constant__ pas::TmaMap tmap_q) {                                         \
        pas::context_sm90_body<QT, D, XV, F8, DUO, LSE>(p, tmap_k, tmap_v, tmap_o, tmap_q);        \
    }

// Entries: paged_attention_context_sm90_{q}_kv_{q}_d{D} (16-bit KV of the Q dtype);
// with the row LSE: ..._lse (LSE = true; not at D 64, whose three consumers
// have no LSE code: the launcher takes the duo entry's _lse there).
#define PAS_ENTRY(QN, QT, D, SFX, LSE) \
    PAS_ENTRY_AT(paged_attention_context_sm90_##QN##_kv_##QN##_d##D##SFX, QT, D, 0, false, false, LSE)
PAS_ENTRY(bf16, 0, 64, , false)
PAS_ENTRY(bf16, 0, 128, , false)
PAS_ENTRY(bf16, 0, 256, , false)
PAS_ENTRY(f16, 1, 64, , false)
PAS_ENTRY(f16, 1, 128, , false)
PAS_ENTRY(f16, 1, 256, , false)
PAS_ENTRY(bf16, 0, 128, _lse, true)
PAS_ENTRY(bf16, 0, 256, _lse, true)
PAS_ENTRY(f16, 1, 128, _lse, true)
PAS_ENTRY(f16, 1, 256, _lse, true)

// Two CTAs per SM (Cfg DUO): paged_attention_context_sm90_{q}_kv_{q}_d{D}_duo[_lse].
#define PAS_ENTRY_DUO(QN, QT, D, SFX, LSE) \
    PAS_ENTRY_AT(paged_attention_context_sm90_##QN##_kv_##QN##_d##D##_duo##SFX, QT, D, 0, false, true, LSE)
PAS_ENTRY_DUO(bf16, 0, 64, , false)
PAS_ENTRY_DUO(bf16, 0, 128, , false)
PAS_ENTRY_DUO(f16, 1, 64, , false)
PAS_ENTRY_DUO(f16, 1, 128, , false)
PAS_ENTRY_DUO(bf16, 0, 64, _lse, true)
PAS_ENTRY_DUO(bf16, 0, 128, _lse, true)
PAS_ENTRY_DUO(f16, 1, 64, _lse, true)
PAS_ENTRY_DUO(f16, 1, 128, _lse, true)

// e4m3 KV entries: paged_attention_context_sm90_{q}_kv_e4m3_d{D}[_lse].
#define PAS_ENTRY8(QN, QT, D, SFX, LSE) \
    PAS_ENTRY_AT(paged_attention_context_sm90_##QN##_kv_e4m3_d##D##SFX, QT, D, 0, true, false, LSE)
PAS_ENTRY8(bf16, 0, 64, , false)
PAS_ENTRY8(bf16, 0, 128, , false)
PAS_ENTRY8(bf16, 0, 256, , false)
PAS_ENTRY8(f16, 1, 64, , false)
PAS_ENTRY8(f16, 1, 128, , false)
PAS_ENTRY8(f16, 1, 256, , false)
PAS_ENTRY8(bf16, 0, 64, _lse, true)
PAS_ENTRY8(bf16, 0, 128, _lse, true)
PAS_ENTRY8(bf16, 0, 256, _lse, true)
PAS_ENTRY8(f16, 1, 64, _lse, true)
PAS_ENTRY8(f16, 1, 128, _lse, true)
PAS_ENTRY8(f16, 1, 256, _lse, true)

// Timing experiments of the bench (D 128 bf16 only): _x{XV}, see context_sm90_body.
#define PAS_XENTRY(XV) \
    PAS_ENTRY_AT(paged_attention_context_sm90_bf16_kv_bf16_d128_x##XV, 0, 128, XV, false, false, false)
PAS_XENTRY(4)
PAS_XENTRY(8)
PAS_XENTRY(512)
PAS_XENTRY(1024)
PAS_XENTRY(1536)
// Dropped for room (session 44; concluded, PERF.md sessions 14, 32): 16 (K /
// V rings 3 / 2), 32 (O rescaled under S) and 40 (32 traced). Dropped for
// room (session 28; measured and concluded, PERF.md sessions 7, 14, 24, 26):
// 64 and 72 (a quarter of the exponentials by polynomial, and
// traced; also the D 64 entry), 128 (row sums on the tensor cores), 4096
// (SX) and 16384 (EXT). Their code paths stay in context_sm90_body.
