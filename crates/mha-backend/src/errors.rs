//! Device-error events per kernel family.
//!
//! Every kernel family counts the entries it skips (an out-of-range page
//! id, slot or index inside device data) in its own error word
//! `[count, flags]`, and each family numbers its flag bits on its own
//! (`page_table::ErrorFlags`, `swa_pool::ErrorFlags`, `fp8_kv::ErrorFlags`,
//! `paged_attention::ErrorFlags`): the same bit means different events in
//! different families. The backend therefore keeps one [`ErrorReport`] per
//! family and never ORs flags across families; [`DeviceErrorReport::events`]
//! names the set bits.

use kernel_rt::abi::Flag;
use kernel_rt::ErrorReport;

/// A backend's device-error events, one report per kernel family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceErrorReport {
    /// page-table: page-table builds (every executor's metadata) and, on
    /// the CUDA executor, the `req_to_token` scatter (a backend bug if ever
    /// counted).
    pub page_table: ErrorReport,
    /// swa-pool: full → SWA slot translations (hybrid models).
    pub swa_pool: ErrorReport,
    /// fp8-kv: K/V writes (slots outside the cache).
    pub kv_write: ErrorReport,
    /// paged-attention: decode, verify, context and merge launches (page
    /// ids outside the cache, bad row offsets).
    pub attention: ErrorReport,
    /// graph-metadata: the CUDA executor's fused metadata launches (eager
    /// passes, graph replays, the engine path), which build the page tables
    /// and SWA slots on the device; the CPU executor's builds count under
    /// `page_table` / `swa_pool` instead.
    pub metadata: ErrorReport,
}

impl DeviceErrorReport {
    /// Family names, in [`Self::families`] order.
    pub const FAMILIES: [&'static str; 5] = [
        "page-table",
        "swa-pool",
        "fp8-kv",
        "paged-attention",
        "graph-metadata",
    ];

    /// No family counted an event.
    pub fn is_clean(&self) -> bool {
        self.families().iter().all(|(_, r, _)| r.is_clean())
    }

    /// Events of every family together (saturating).
    pub fn count(&self) -> u32 {
        self.families()
            .iter()
            .fold(0u32, |n, (_, r, _)| n.saturating_add(r.count))
    }

    /// `(family, report, the family's flag set)` for each family.
    pub fn families(&self) -> [(&'static str, ErrorReport, &'static [Flag]); 5] {
        [
            (
                Self::FAMILIES[0],
                self.page_table,
                page_table::ErrorFlags::ABI,
            ),
            (Self::FAMILIES[1], self.swa_pool, swa_pool::ErrorFlags::ABI),
            (Self::FAMILIES[2], self.kv_write, fp8_kv::ErrorFlags::ABI),
            (
                Self::FAMILIES[3],
                self.attention,
                paged_attention::ErrorFlags::ABI,
            ),
            (
                Self::FAMILIES[4],
                self.metadata,
                graph_metadata::ErrorFlags::ABI,
            ),
        ]
    }

    /// Adds `other` family by family.
    pub fn merge(&mut self, other: &Self) {
        self.page_table.merge(other.page_table);
        self.swa_pool.merge(other.swa_pool);
        self.kv_write.merge(other.kv_write);
        self.attention.merge(other.attention);
        self.metadata.merge(other.metadata);
    }

    /// `family: FLAG` for every set flag bit ([`flag_names`]).
    pub fn events(&self) -> Vec<String> {
        self.families()
            .iter()
            .flat_map(|(family, r, flags)| {
                flag_names(*r, flags)
                    .into_iter()
                    .map(move |n| format!("{family}: {n}"))
            })
            .collect()
    }
}

/// The names of `report`'s set flags in the family flag set `flags`, and
/// `bits 0x…` for set bits the family does not name.
pub fn flag_names(report: ErrorReport, flags: &[Flag]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = report.flags;
    for f in flags {
        if report.flags & f.bits != 0 {
            out.push(f.name.to_string());
            rest &= !f.bits;
        }
    }
    if rest != 0 {
        out.push(format!("bits {rest:#x}"));
    }
    out
}

impl std::fmt::Display for DeviceErrorReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_clean() {
            return write!(f, "no device errors");
        }
        let parts: Vec<String> = self
            .families()
            .iter()
            .filter(|(_, r, _)| !r.is_clean())
            .map(|(name, r, _)| format!("{name} {} event(s)", r.count))
            .collect();
        write!(f, "{} ({})", parts.join(", "), self.events().join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_stay_apart() {
        let mut a = DeviceErrorReport::default();
        assert!(a.is_clean());
        assert_eq!(a.to_string(), "no device errors");
        // The same bit in two families means two different events.
        let bit = paged_attention::ErrorFlags::ABI[0].bits;
        a.attention = ErrorReport {
            count: 2,
            flags: bit,
        };
        let b = DeviceErrorReport {
            kv_write: ErrorReport {
                count: 1,
                flags: bit | 0x8000_0000,
            },
            ..DeviceErrorReport::default()
        };
        a.merge(&b);
        assert_eq!(a.count(), 3);
        assert_eq!(a.attention.flags, bit);
        assert_eq!(a.kv_write.flags, bit | 0x8000_0000);
        let ev = a.events();
        assert!(ev.iter().any(|e| e.starts_with("paged-attention: ")));
        assert!(ev.iter().any(|e| e.starts_with("fp8-kv: ")));
        assert!(
            ev.contains(&"fp8-kv: bits 0x80000000".to_string()),
            "{ev:?}"
        );
        assert!(!a.is_clean());
        assert!(a.to_string().contains("fp8-kv 1 event(s)"));
    }
}
