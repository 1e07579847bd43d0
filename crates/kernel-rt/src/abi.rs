//! One ABI: the kernel parameter structs and error-flag bits are defined once,
//! in Rust, and the C header every kernel includes is generated from them.
//!
//! A kernel crate declares
//!
//! - each params struct with [`abi_struct!`](crate::abi_struct): a plain
//!   `#[repr(C)]` struct whose fields also name their C type
//!   (`pub req_to_token: u64 = "const i32*",`); the macro adds
//!   `Self::ABI`, a [`Struct`] table of (field, C type, offset, size) taken
//!   from `core::mem::offset_of!` / `size_of`;
//! - its error flags with [`abi_flags!`](crate::abi_flags) around the
//!   `impl ErrorFlags { pub const X: Self = Self(bit); … }` block, which adds
//!   `ErrorFlags::ABI`, the [`Flag`] list;
//! - one [`Header`] naming the generated file and what goes in it.
//!
//! `cargo xtask abi` writes each crate's header with [`render`]
//! (`crates/<crate>/kernels/<crate>_abi.cuh`); `cargo xtask abi --check` and a
//! CPU test of each crate ([`check_committed`]) fail when the committed file
//! differs. The header carries `static_assert`s on the struct's size and
//! alignment and on every field's size and alignment (NVRTC has no constant
//! `offsetof`; with the fields in Rust's order these fix every offset, which
//! each message names), so the C compiler checks the layout whenever the PTX
//! is built.

use std::fmt::Write as _;
use std::path::Path;

/// One field of a params struct.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// Field name, the same in Rust and C.
    pub name: &'static str,
    /// C type of the field (`"const i32*"`, `"i64"`, `"float"`, …).
    pub c_type: &'static str,
    /// Byte offset (`offset_of!` of the Rust struct).
    pub offset: usize,
    /// Byte size of the Rust field.
    pub size: usize,
    /// Alignment of the Rust field.
    pub align: usize,
    /// The Rust doc comment, one line per entry; the C comment.
    pub doc: &'static [&'static str],
}

/// A `#[repr(C)]` params struct as the generator sees it ([`abi_struct!`](crate::abi_struct)).
#[derive(Debug, Clone, Copy)]
pub struct Struct {
    /// Struct name, the same in Rust and C.
    pub name: &'static str,
    /// `size_of` of the Rust struct.
    pub size: usize,
    /// `align_of` of the Rust struct.
    pub align: usize,
    /// The Rust doc comment, one line per entry (not rendered into C).
    pub doc: &'static [&'static str],
    /// Fields in declaration order.
    pub fields: &'static [Field],
}

/// One flag bit of a family's device error word ([`abi_flags!`](crate::abi_flags)).
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    /// Rust constant name; the C name is the set's prefix followed by it.
    pub name: &'static str,
    /// The bit.
    pub bits: u32,
    /// The Rust doc comment, one line per entry.
    pub doc: &'static [&'static str],
}

/// A family's flag set and the prefix of its C names (`PT_` gives
/// `#define PT_BAD_ENTRY 128u`).
#[derive(Debug, Clone, Copy)]
pub struct FlagSet {
    /// Rust path of the flag type, for the header's comment.
    pub rust: &'static str,
    /// Prefix of the C `#define` names.
    pub c_prefix: &'static str,
    /// The flags (`ErrorFlags::ABI`).
    pub flags: &'static [Flag],
}

/// One generated C header: what a kernel crate's `.cu` files include instead
/// of hand-written mirrors.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    /// Where the file goes, relative to the crate root
    /// (`"kernels/page_table_abi.cuh"`).
    pub path: &'static str,
    /// Name of the crate the definitions live in, for the header's comment.
    pub rust_crate: &'static str,
    /// Flag sets, each rendered as `#define`s.
    pub flag_sets: &'static [FlagSet],
    /// Params structs, each rendered with its `static_assert`s.
    pub structs: &'static [Struct],
}

/// Byte size (and alignment) of a C type the generator accepts: 64-bit
/// pointers and the fixed-width types of `mha_kit/common.cuh`.
fn c_type_size(c_type: &str) -> Option<usize> {
    if c_type.ends_with('*') {
        return Some(8);
    }
    match c_type {
        "i8" | "u8" => Some(1),
        "u16" => Some(2),
        "i32" | "u32" | "float" => Some(4),
        "i64" | "u64" | "double" => Some(8),
        _ => None,
    }
}

/// Checks the table before anything is rendered: each field's C type has the
/// Rust field's size and alignment, and the fields are in offset order without
/// overlap.
///
/// # Errors
/// A message naming the struct and field.
pub fn validate(s: &Struct) -> Result<(), String> {
    let mut end = 0;
    for f in s.fields {
        let c = c_type_size(f.c_type).ok_or_else(|| {
            format!(
                "{}.{}: C type `{}` is not one the generator knows",
                s.name, f.name, f.c_type
            )
        })?;
        if c != f.size || c != f.align {
            return Err(format!(
                "{}.{}: C type `{}` has {c} bytes and alignment, the Rust field {} / {}",
                s.name, f.name, f.c_type, f.size, f.align
            ));
        }
        if f.offset < end {
            return Err(format!(
                "{}.{}: offset {} overlaps",
                s.name, f.name, f.offset
            ));
        }
        end = f.offset + f.size;
    }
    if end > s.size {
        return Err(format!("{}: fields end past its size {}", s.name, s.size));
    }
    Ok(())
}

/// The doc lines, trimmed, without empty ones.
fn doc_lines(doc: &[&str]) -> Vec<String> {
    doc.iter()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Renders `header` as C. Deterministic: the same definitions give the same
/// bytes, which is what `--check` compares.
///
/// # Errors
/// A struct that fails [`validate`].
pub fn render(header: &Header) -> Result<String, String> {
    let mut o = String::new();
    let krate = header.rust_crate;
    // Writing to a String cannot fail.
    let _ = writeln!(
        o,
        "// Generated by `cargo xtask abi` from the Rust definitions in the `{krate}` crate\n\
         // (kernel_rt::abi_struct! / abi_flags!). DO NOT EDIT: change the Rust struct or flag,\n\
         // then run `cargo xtask abi` and `cargo xtask ptx-build`.\n\
         #pragma once\n\
         #include \"mha_kit/common.cuh\""
    );
    for set in header.flag_sets {
        let _ = writeln!(
            o,
            "\n// Flag bits of the device error word: {krate}::{} (`{}*`).",
            set.rust, set.c_prefix
        );
        let width = set
            .flags
            .iter()
            .map(|f| set.c_prefix.len() + f.name.len())
            .max()
            .unwrap_or(0);
        let bits_width = set
            .flags
            .iter()
            .map(|f| f.bits.to_string().len() + 1)
            .max()
            .unwrap_or(0);
        for f in set.flags {
            let name = format!("{}{}", set.c_prefix, f.name);
            let bits = format!("{}u", f.bits);
            let doc = doc_lines(f.doc).join(" ");
            let line = format!("#define {name:<width$} {bits:>bits_width$}");
            if doc.is_empty() {
                let _ = writeln!(o, "{line}");
            } else {
                let _ = writeln!(o, "{line}  // {doc}");
            }
        }
    }
    for s in header.structs {
        validate(s)?;
        let _ = writeln!(o, "\n// {krate}::{} ({} bytes).", s.name, s.size);
        let _ = writeln!(o, "struct {} {{", s.name);
        let width = s
            .fields
            .iter()
            .map(|f| f.c_type.len() + 1 + f.name.len() + 1)
            .max()
            .unwrap_or(0);
        for f in s.fields {
            let decl = format!("{} {};", f.c_type, f.name);
            let mut doc = doc_lines(f.doc);
            // A Rust doc that opens with the C type (`const i32*` `[R, W]`.)
            // says it once more than the C declaration needs.
            if let Some(first) = doc.first_mut() {
                if let Some(rest) = first.strip_prefix(&format!("`{}` ", f.c_type)) {
                    *first = rest.to_string();
                }
            }
            match doc.as_slice() {
                [] => {
                    let _ = writeln!(o, "    {decl}");
                }
                [one] => {
                    let _ = writeln!(o, "    {decl:<width$}  // {one}");
                }
                many => {
                    for l in many {
                        let _ = writeln!(o, "    // {l}");
                    }
                    let _ = writeln!(o, "    {decl}");
                }
            }
        }
        let _ = writeln!(o, "}};");
        let n = s.name;
        let _ = writeln!(
            o,
            "static_assert(sizeof({n}) == {}, \"{n}: size differs from Rust\");",
            s.size
        );
        let _ = writeln!(
            o,
            "static_assert(alignof({n}) == {}, \"{n}: alignment differs from Rust\");",
            s.align
        );
        // NVRTC 12.4 has no constant `offsetof` (neither the macro, nor
        // `__builtin_offsetof`, nor the null-pointer form is a constant
        // expression there). The fields are declared in Rust's order, so
        // pinning each one's size and alignment pins its offset (the C layout
        // rule `repr(C)` follows); the message names the Rust offset.
        for f in s.fields {
            let name = f.name;
            let _ = writeln!(
                o,
                "static_assert(sizeof({n}::{name}) == {size} && alignof(decltype({n}::{name})) == {align}, \"{n}::{name} (offset {off}): size or alignment differs from Rust\");",
                size = f.size,
                align = f.align,
                off = f.offset
            );
        }
    }
    Ok(o)
}

/// Compares the committed header under `crate_dir` with [`render`]`(header)`:
/// the CPU test each kernel crate runs.
///
/// # Errors
/// A message saying the file is missing or stale and how to regenerate it.
pub fn check_committed(crate_dir: &Path, header: &Header) -> Result<(), String> {
    let want = render(header)?;
    let path = crate_dir.join(header.path);
    let have = std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e}; run `cargo xtask abi`", path.display()))?;
    if have != want {
        return Err(format!(
            "{} differs from its Rust definitions; run `cargo xtask abi`",
            path.display()
        ));
    }
    Ok(())
}

/// Declares a `#[repr(C)]` kernel params struct whose fields also name their
/// C type, and adds `pub const ABI: kernel_rt::abi::Struct` (name, size,
/// alignment, doc and per field name, C type, `offset_of!`, `size_of`) for the
/// generated header.
///
/// The struct's doc comment comes first, then `#[repr(C)]`, then any other
/// attributes; fields carry only doc comments.
///
/// ```
/// kernel_rt::abi_struct! {
///     /// Parameters of a kernel.
///     #[repr(C)]
///     #[derive(Debug, Clone, Copy, Default)]
///     pub struct ExampleParams {
///         /// `[n]` input.
///         pub input: u64 = "const i32*",
///         /// Elements.
///         pub n: i64 = "i64",
///     }
/// }
/// assert_eq!(ExampleParams::ABI.size, 16);
/// assert_eq!(ExampleParams::ABI.fields[1].offset, 8);
/// ```
#[macro_export]
macro_rules! abi_struct {
    (
        $(#[doc = $doc:literal])*
        #[repr(C)]
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[doc = $fdoc:literal])*
                $fvis:vis $field:ident : $ty:ty = $cty:literal
            ),* $(,)?
        }
    ) => {
        $(#[doc = $doc])*
        #[repr(C)]
        $(#[$meta])*
        $vis struct $name {
            $(
                $(#[doc = $fdoc])*
                $fvis $field: $ty,
            )*
        }

        impl $name {
            /// Layout of this struct for the generated C header (`cargo xtask abi`).
            pub const ABI: $crate::abi::Struct = $crate::abi::Struct {
                name: stringify!($name),
                size: ::core::mem::size_of::<$name>(),
                align: ::core::mem::align_of::<$name>(),
                doc: &[$($doc),*],
                fields: &[
                    $(
                        $crate::abi::Field {
                            name: stringify!($field),
                            c_type: $cty,
                            offset: ::core::mem::offset_of!($name, $field),
                            size: ::core::mem::size_of::<$ty>(),
                            align: ::core::mem::align_of::<$ty>(),
                            doc: &[$($fdoc),*],
                        },
                    )*
                ],
            };
        }
    };
}

/// Wraps a family's `impl ErrorFlags { pub const X: Self = Self(bit); … }`
/// block and adds `pub const ABI: &[kernel_rt::abi::Flag]`, every constant
/// with its bit and doc, for the generated header's `#define`s.
///
/// ```
/// #[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// pub struct ErrorFlags(u32);
/// kernel_rt::abi_flags! {
///     impl ErrorFlags {
///         /// An index outside its range.
///         pub const BAD_INDEX: Self = Self(1);
///     }
/// }
/// assert_eq!(ErrorFlags::ABI[0].name, "BAD_INDEX");
/// assert_eq!(ErrorFlags::ABI[0].bits, 1);
/// ```
#[macro_export]
macro_rules! abi_flags {
    (
        impl $name:ident {
            $(
                $(#[doc = $doc:literal])*
                pub const $flag:ident : Self = Self($bits:literal);
            )*
        }
    ) => {
        impl $name {
            $(
                $(#[doc = $doc])*
                pub const $flag: Self = Self($bits);
            )*

            /// Every flag of this set, for the generated C header (`cargo xtask abi`).
            pub const ABI: &'static [$crate::abi::Flag] = &[
                $(
                    $crate::abi::Flag {
                        name: stringify!($flag),
                        bits: $bits,
                        doc: &[$($doc),*],
                    },
                )*
            ];
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::abi_struct! {
        /// A test struct.
        #[repr(C)]
        #[derive(Debug, Clone, Copy, Default)]
        pub struct Probe {
            /// `const float*` `[n]`.
            pub p: u64 = "const float*",
            /// Count.
            pub n: i32 = "i32",
            pub x: f32 = "float",
            /// Two
            /// lines.
            pub q: u64 = "u64",
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Bits(u32);
    crate::abi_flags! {
        impl Bits {
            /// First.
            pub const ONE: Self = Self(1);
            /// Second.
            pub const TWO: Self = Self(512);
        }
    }

    const HEADER: Header = Header {
        path: "kernels/probe_abi.cuh",
        rust_crate: "probe",
        flag_sets: &[FlagSet {
            rust: "Bits",
            c_prefix: "PR_",
            flags: Bits::ABI,
        }],
        structs: &[Probe::ABI],
    };

    #[test]
    fn table_follows_the_rust_layout() {
        let s = Probe::ABI;
        assert_eq!((s.size, s.align), (24, 8));
        let offs: Vec<_> = s
            .fields
            .iter()
            .map(|f| (f.name, f.offset, f.size))
            .collect();
        assert_eq!(offs, [("p", 0, 8), ("n", 8, 4), ("x", 12, 4), ("q", 16, 8)]);
        assert_eq!((Bits::ONE, Bits::TWO), (Bits(1), Bits(512)));
    }

    #[test]
    fn renders_struct_asserts_and_defines() {
        let text = render(&HEADER).unwrap();
        assert!(text.starts_with("// Generated by `cargo xtask abi`"));
        assert!(text.contains("#define PR_ONE   1u  // First.\n"));
        assert!(text.contains("#define PR_TWO 512u  // Second.\n"));
        assert!(text.contains("    const float* p;  // `[n]`.\n"));
        assert!(text.contains("    float x;\n"));
        assert!(text.contains("    // Two\n    // lines.\n    u64 q;\n"));
        assert!(text.contains("static_assert(sizeof(Probe) == 24,"));
        assert!(text.contains("static_assert(alignof(Probe) == 8,"));
        assert!(text.contains(
            "static_assert(sizeof(Probe::q) == 8 && alignof(decltype(Probe::q)) == 8, \"Probe::q (offset 16):"
        ));
        assert_eq!(render(&HEADER).unwrap(), text);
    }

    #[test]
    fn rejects_a_c_type_of_another_size() {
        let mut fields = Probe::ABI.fields.to_vec();
        fields[1].c_type = "i64";
        let bad = Struct {
            fields: Vec::leak(fields),
            ..Probe::ABI
        };
        assert!(validate(&bad).unwrap_err().contains("Probe.n"));
        let mut fields = Probe::ABI.fields.to_vec();
        fields[1].c_type = "size_t";
        let bad = Struct {
            fields: Vec::leak(fields),
            ..Probe::ABI
        };
        assert!(validate(&bad)
            .unwrap_err()
            .contains("not one the generator knows"));
    }
}
