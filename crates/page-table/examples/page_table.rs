//! Builds the page table of SEMANTICS.md §page-table.7 (P = 4, with a full→SWA map) on
//! the GPU when one is present, and with the CPU reference otherwise, and
//! prints both tables.
//!
//! `cargo run --release -p page-table --example page_table`

use kernel_rt::{gpu_status, DeviceErrors, Gpu, GpuStatus, Strided, StridedMut};
use page_table::reference::{build_page_table, HostInputs};
use page_table::{PageTableArgs, PageTableKernel, SwaTables};

const P: usize = 4;
const M: usize = 4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // req_to_token: row 0 is the all-zero padding row; rows 1 and 2 hold requests.
    let r2t: Vec<i32> = [
        [0; 16],
        [12, 13, 14, 15, 28, 29, 30, 31, 8, 9, 10, 11, 40, 41, 42, 43],
        [20, 21, 22, 23, 36, 37, 38, 39, 0, 0, 0, 0, 0, 0, 0, 0],
    ]
    .concat();
    let rpi = [1i64, 2];
    let cache_seqlens = [13i32, 7];
    // Full→SWA map: full pages 3→1, 2→2, 10→3, 5→4, 9→5; page 7 evicted; last entry −1.
    let mut map = vec![0i64; 53];
    for (full, swa) in [(3, 1), (2, 2), (10, 3), (5, 4), (9, 5)] {
        for o in 0..P {
            map[full * P + o] = (swa * P + o) as i64;
        }
    }
    map[52] = -1;

    let (device, table, swa, err) = match gpu_status() {
        GpuStatus::Available { .. } => {
            let gpu = Gpu::shared()?;
            let s = gpu.stream();
            let (d_r2t, d_rpi, d_lens, d_map) = (
                s.clone_htod(&r2t)?,
                s.clone_htod(&rpi)?,
                s.clone_htod(&cache_seqlens)?,
                s.clone_htod(&map)?,
            );
            let mut d_table = s.clone_htod(&[-1i32; 2 * M])?;
            let mut d_swa = s.clone_htod(&[-1i32; 2 * M])?;
            let mut errors = DeviceErrors::new(&gpu)?;
            let kernel = PageTableKernel::new(&gpu)?;
            kernel.launch(
                &mut PageTableArgs {
                    req_to_token: Strided::of("req_to_token", &d_r2t, [3, 16])?,
                    req_pool_indices: Strided::of("req_pool_indices", &d_rpi, [2])?,
                    cache_seqlens: Strided::of("cache_seqlens", &d_lens, [2])?,
                    page_size: P,
                    page_table: StridedMut::of("page_table", &mut d_table, [2, M])?,
                    swa: Some(SwaTables {
                        full_to_swa: Strided::of("full_to_swa", &d_map, [map.len()])?,
                        swa_page_table: StridedMut::of("swa_page_table", &mut d_swa, [2, M])?,
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
        GpuStatus::Missing(why) => {
            let mut table = vec![-1i32; 2 * M];
            let mut swa = vec![-1i32; 2 * M];
            let input = HostInputs {
                req_to_token: &r2t,
                req_to_token_rows: 3,
                req_to_token_width: 16,
                req_to_token_stride: 16,
                req_pool_indices: &rpi,
                cache_seqlens: &cache_seqlens,
                page_size: P,
                max_num_pages: M,
                full_to_swa: Some(&map),
                pool_slots: None,
            };
            let err = build_page_table(&input, &mut table, M, Some((&mut swa, M)));
            (format!("CPU reference (no GPU: {why})"), table, swa, err)
        }
    };
    println!("device: {device}");
    println!(
        "device error word: {} event(s), flags {:#x}",
        err.count, err.flags
    );
    println!("P = {P}, cache_seqlens = {cache_seqlens:?} (entries past each live prefix keep their -1 fill)");
    for row in 0..2 {
        println!(
            "row {row}: page_table {:?}   swa_page_table {:?}",
            &table[row * M..(row + 1) * M],
            &swa[row * M..(row + 1) * M]
        );
    }
    Ok(())
}
