//! kernel-rt's own PTX: fresh and exporting its entry point; its cubin fresh.

#[test]
fn spin_kernel_ptx_is_fresh_and_named() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let ptx = kernel_rt::timing::PTX;
    assert!(ptx.has_entry("kernel_rt_spin"));
    kernel_rt::ptxhash::check_fresh(
        &dir.join("../.."),
        &dir.join("kernels/kernel_rt.cu"),
        ptx.ptx,
    )
    .unwrap();
}

#[test]
fn spin_kernel_cubin_is_fresh() {
    let ptx = kernel_rt::timing::PTX;
    kernel_rt::ptxhash::check_cubin(&ptx).unwrap();
    assert_eq!(ptx.cubin.map(|c| c.arch), Some(kernel_rt::CubinArch::Sm90));
    assert_eq!(ptx.entries().collect::<Vec<_>>(), ["kernel_rt_spin"]);
}
