//! Host e4m3 (`float8_e4m3fn`) codec, bit-exact with the device (SEMANTICS.md §fp8-kv.4,
//! DESIGN.md D7).
//!
//! Two encoders exist upstream; mha-kit writes only with the saturating one:
//!
//! | encoder | `448 < |x| ≤ 464` | `|x| > 464`, ±∞ | NaN |
//! |---|---|---|---|
//! | [`e4m3_encode_satfinite`] (fused write, `cvt.rn.satfinite`) | ±448 | ±448 (`0x7E`/`0xFE`) | `0x7F` (any sign) |
//! | [`e4m3_encode_framework`] (PyTorch cast, comparison only) | ±448 | NaN (`0x7F` with the sign bit) | `0x7F` with the sign bit |
//!
//! Both round to nearest, ties to even, in the normal and subnormal ranges
//! (`2^-10` → 0, `3·2^-10` → `2^-8`). The saturating encoder is the `float8`
//! crate (whose e4m3 conversion is NVIDIA's satfinite one) with one change:
//! the crate keeps a NaN's sign (−NaN → `0xFF`), the GPU gives `0x7F`.

use float8::F8E4M3;

/// The e4m3 code of a NaN written by mha-kit.
pub const E4M3_NAN: u8 = 0x7F;
/// The code of the largest finite e4m3 value, 448.
pub const E4M3_MAX: u8 = 0x7E;
/// The largest finite e4m3 value.
pub const E4M3_MAX_VALUE: f32 = 448.0;

/// Saturating e4m3 encoding of `x`: round to nearest even, finite overflow and
/// ±∞ → ±448, every NaN → [`E4M3_NAN`] (`0x7F`). The rule of every mha-kit
/// FP8 write (SEMANTICS.md §fp8-kv.3 `e4m3_rn_satfinite`).
pub fn e4m3_encode_satfinite(x: f32) -> u8 {
    if x.is_nan() {
        E4M3_NAN
    } else {
        F8E4M3::from_f32(x).to_bits()
    }
}

/// PyTorch's non-saturating cast to `float8_e4m3fn` (SEMANTICS.md §fp8-kv.4, "framework
/// cast"): as [`e4m3_encode_satfinite`] for `|x| ≤ 464`; `|x| > 464`, ±∞ and
/// NaN give NaN, `0x7F` with `x`'s sign bit. mha-kit never writes with it;
/// it exists to state upstream's generic path in tests (SEMANTICS.md §fp8-kv.6, edge cases
/// 28, 29).
pub fn e4m3_encode_framework(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_nan() || x.abs() > 464.0 {
        E4M3_NAN | sign
    } else {
        F8E4M3::from_f32(x).to_bits()
    }
}

/// The value of e4m3 code `code` as f32 (exact); `0x7F` and `0xFF` are NaN.
pub fn e4m3_decode(code: u8) -> f32 {
    F8E4M3::from_bits(code).to_f32()
}

/// Exact widening of bf16 bits to f32.
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    half::bf16::from_bits(bits).to_f32()
}

/// Exact widening of f16 bits to f32.
pub fn f16_bits_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// The fused write's quantization of one element (SEMANTICS.md §fp8-kv.3): widen, multiply by
/// the f32 reciprocal `inv_scale` (one f32 rounding), encode saturating.
pub fn quantize(x: f32, inv_scale: f32) -> u8 {
    e4m3_encode_satfinite(x * inv_scale)
}
