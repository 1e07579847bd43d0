//! # 01 — the page table
//!
//! Builds the page table (and the SWA page table) of the worked example in
//! SEMANTICS.md §page-table.7 from the three inputs a serving engine keeps:
//! `req_to_token`, `req_pool_indices` and `cache_seqlens`. On a GPU it runs
//! page-table's kernel (`PageTableKernel`, one launch); without one, the CPU
//! reference (`page_table::reference::build_page_table`), which the kernel
//! matches bit for bit.
//!
//! ```text
//! cargo run --release -p mha-kit-examples --example 01_page_table
//! ```
//!
//! Prints the device used, the device error word (0 events), and per batch
//! row its page table and SWA page table:
//!
//! ```text
//! row 0: page_table [3, 7, 2, 10]   swa_page_table [1, 0, 2, 3]
//! row 1: page_table [5, 9, -1, -1]   swa_page_table [4, 5, -1, -1]
//! ```
//!
//! ## The terms
//!
//! - **slot**: one token's place in the KV pool (its K and V rows). The pool
//!   is cut into **pages** of `page_size` (`P`) consecutive slots: slot `s`
//!   is offset `s % P` of page `s / P`. Page 0 is a dummy page that padding
//!   writes land in.
//! - **`req_to_token`** `[R, W]` i32: row `r` lists the slot of every token
//!   position of the request living in row `r` (`W` = the context length).
//!   Row 0 is reserved (all zeros). The allocator fills whole pages in order,
//!   so one entry per page (position `p · P`) tells the whole page.
//! - **`req_pool_indices`** `[bs]`: which `req_to_token` row each request of
//!   the batch uses.
//! - **`cache_seqlens`** `[bs]` i32: `L_i`, how many tokens of request `i`
//!   are in the cache (attended over), the new ones included.
//! - **page table** `[bs, M]` i32 (`M = max_num_pages`, the table width):
//!   `page_table[i, p] = req_to_token[req_pool_indices[i], p · P] / P` for
//!   the `ceil(L_i / P)` live pages. Columns past them are never written (here
//!   they keep the `-1` fill): attention reads only live pages.
//! - **SWA page table**: the same for the sliding-window (SWA) pool of a
//!   hybrid model, through the full→SWA slot map (an unmapped page gives SWA
//!   page 0, the dummy page).

use std::error::Error;
use std::fmt::Write as _;

use kernel_rt::{gpu_status, DeviceErrors, Gpu, GpuStatus, Strided, StridedMut};
use page_table::reference::{build_page_table, HostInputs};
use page_table::{PageTableArgs, PageTableKernel, SwaTables};

/// `P`: tokens per page.
const P: usize = 4;
/// `M`: page-table width (`ceil(context_len / P)` = 16 / 4).
const M: usize = 4;
/// Requests in the batch.
const BS: usize = 2;

/// Builds the two tables (on the GPU when `allow_gpu` and one is present,
/// else with the CPU reference) and returns the printed report.
///
/// # Errors
/// Driver or launch errors on the GPU path.
pub fn run(allow_gpu: bool) -> Result<String, Box<dyn Error>> {
    // req_to_token [3, 16]: row 0 is the all-zero reserved row; rows 1 and 2
    // hold one request each. Row 1's positions 0..4 sit in slots 12..16
    // (page 3), 4..8 in 28..32 (page 7), 8..12 in 8..12 (page 2), 12..16 in
    // 40..44 (page 10): pages need not be contiguous or ordered.
    let req_to_token: Vec<i32> = [
        [0; 16],
        [12, 13, 14, 15, 28, 29, 30, 31, 8, 9, 10, 11, 40, 41, 42, 43],
        [20, 21, 22, 23, 36, 37, 38, 39, 0, 0, 0, 0, 0, 0, 0, 0],
    ]
    .concat();
    // Batch entry 0 is the request in row 1, entry 1 the one in row 2.
    let req_pool_indices = [1i64, 2];
    // 13 tokens → ceil(13 / 4) = 4 live pages; 7 tokens → 2 pages.
    let cache_seqlens = [13i32, 7];
    // Full→SWA slot map of a hybrid model: full pages 3→1, 2→2, 10→3, 5→4,
    // 9→5; full page 7 has been evicted from the window (unmapped, 0). The
    // last entry is the −1 sentinel.
    let mut full_to_swa = vec![0i64; 53];
    for (full, swa) in [(3, 1), (2, 2), (10, 3), (5, 4), (9, 5)] {
        for o in 0..P {
            full_to_swa[full * P + o] = (swa * P + o) as i64;
        }
    }
    full_to_swa[52] = -1;

    let status = gpu_status();
    let (device, table, swa, err) = match status {
        GpuStatus::Available { .. } if allow_gpu => {
            let gpu = Gpu::shared()?;
            let s = gpu.stream();
            let (d_r2t, d_rpi, d_lens, d_map) = (
                s.clone_htod(&req_to_token)?,
                s.clone_htod(&req_pool_indices)?,
                s.clone_htod(&cache_seqlens)?,
                s.clone_htod(&full_to_swa)?,
            );
            let mut d_table = s.clone_htod(&[-1i32; BS * M])?;
            let mut d_swa = s.clone_htod(&[-1i32; BS * M])?;
            // The device error word: kernels count bad device data there
            // instead of reading out of bounds.
            let mut errors = DeviceErrors::new(&gpu)?;
            let kernel = PageTableKernel::new(&gpu)?;
            kernel.launch(
                &mut PageTableArgs {
                    req_to_token: Strided::of("req_to_token", &d_r2t, [3, 16])?,
                    req_pool_indices: Strided::of("req_pool_indices", &d_rpi, [BS])?,
                    cache_seqlens: Strided::of("cache_seqlens", &d_lens, [BS])?,
                    page_size: P,
                    page_table: StridedMut::of("page_table", &mut d_table, [BS, M])?,
                    swa: Some(SwaTables {
                        full_to_swa: Strided::of("full_to_swa", &d_map, [full_to_swa.len()])?,
                        swa_page_table: StridedMut::of("swa_page_table", &mut d_swa, [BS, M])?,
                    }),
                    pool_slots: None,
                },
                &mut errors,
            )?;
            (
                gpu.describe(),
                s.clone_dtoh(&d_table)?,
                s.clone_dtoh(&d_swa)?,
                errors.read()?,
            )
        }
        _ => {
            let why = match status {
                GpuStatus::Missing(why) => format!("no GPU: {why}"),
                GpuStatus::Available { .. } => "CPU path requested".to_string(),
            };
            let mut table = vec![-1i32; BS * M];
            let mut swa = vec![-1i32; BS * M];
            let input = HostInputs {
                req_to_token: &req_to_token,
                req_to_token_rows: 3,
                req_to_token_width: 16,
                req_to_token_stride: 16,
                req_pool_indices: &req_pool_indices,
                cache_seqlens: &cache_seqlens,
                page_size: P,
                max_num_pages: M,
                full_to_swa: Some(&full_to_swa),
                pool_slots: None,
            };
            let err = build_page_table(&input, &mut table, M, Some((&mut swa, M)));
            (format!("CPU reference ({why})"), table, swa, err)
        }
    };
    let mut out = String::new();
    writeln!(out, "device: {device}")?;
    writeln!(
        out,
        "device error word: {} event(s), flags {:#x}",
        err.count, err.flags
    )?;
    writeln!(
        out,
        "P = {P}, M = {M}, req_pool_indices = {req_pool_indices:?}, cache_seqlens = {cache_seqlens:?}"
    )?;
    writeln!(
        out,
        "(page = req_to_token[row, p * P] / P for the ceil(L / P) live pages; the rest keep their -1 fill)"
    )?;
    for row in 0..BS {
        writeln!(
            out,
            "row {row}: page_table {:?}   swa_page_table {:?}",
            &table[row * M..(row + 1) * M],
            &swa[row * M..(row + 1) * M]
        )?;
    }
    Ok(out)
}

fn main() -> Result<(), Box<dyn Error>> {
    print!("{}", run(true)?);
    Ok(())
}
