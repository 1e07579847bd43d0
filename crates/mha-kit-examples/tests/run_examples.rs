//! Runs the CPU path of every numbered example (`run(false)`, whatever the
//! machine has) and checks what it prints: the page tables of 01, the
//! decode output of 02 (finite, equal to a direct computation), the passes
//! of 03 and the replay of 04.

#[allow(dead_code)]
#[path = "../examples/01_page_table.rs"]
mod ex01;
#[allow(dead_code)]
#[path = "../examples/02_decode.rs"]
mod ex02;
#[allow(dead_code)]
#[path = "../examples/03_backend_step.rs"]
mod ex03;
#[allow(dead_code)]
#[path = "../examples/04_replay.rs"]
mod ex04;

/// The number after `key` in `text` (up to the next space, comma or
/// parenthesis), parsed.
fn number_after<T: std::str::FromStr>(text: &str, key: &str) -> T {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("`{key}` not in:\n{text}"));
    let rest = &text[at + key.len()..];
    let end = rest.find([' ', ',', '(', ')', '\n']).unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|_| panic!("`{key}` is not followed by a number in:\n{text}"))
}

#[test]
fn ex01_page_table_prints_the_worked_example() {
    let out = ex01::run(false).unwrap();
    assert!(out.contains("device: CPU reference"), "{out}");
    assert!(out.contains("device error word: 0 event(s)"), "{out}");
    // SEMANTICS.md §page-table.7 with cache_seqlens [13, 7].
    assert!(
        out.contains("row 0: page_table [3, 7, 2, 10]   swa_page_table [1, 0, 2, 3]"),
        "{out}"
    );
    assert!(
        out.contains("row 1: page_table [5, 9, -1, -1]   swa_page_table [4, 5, -1, -1]"),
        "{out}"
    );
}

#[test]
fn ex02_decode_matches_the_direct_computation() {
    let out = ex02::run(false).unwrap();
    assert!(out.contains("device: CPU reference"), "{out}");
    assert!(out.contains("all finite: true"), "{out}");
    for (i, pages) in ["[7, 2, 11]", "[5]", "[14, 3, 9, 1, 12]"]
        .iter()
        .enumerate()
    {
        assert!(out.contains(&format!("request {i}: L = ")), "{out}");
        assert!(out.contains(pages), "{out}");
    }
    let err: f64 = number_after(&out, "max |reference - direct| = ");
    assert!(
        err < 1e-12,
        "reference and direct computation differ by {err}"
    );
    let sum: f64 = number_after(&out, "checksum ");
    assert!(sum.is_finite() && sum != 0.0, "{out}");
}

#[test]
fn ex03_backend_step_runs_every_pass() {
    let out = ex03::run(false).unwrap();
    assert!(out.contains("executor: cpu"), "{out}");
    assert!(out.contains("CUDA graphs: not available"), "{out}");
    assert!(out.contains("cache_seqlens [40, 23]"), "{out}");
    assert!(
        out.contains("extend pass: out [63, 512] x 2 layers"),
        "{out}"
    );
    for step in 1..=3 {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("decode step {step}/3")))
            .unwrap_or_else(|| panic!("decode step {step} missing:\n{out}"));
        assert!(
            line.contains(&format!("seq_lens [{}, {}]", 40 + step, 23 + step)),
            "{line}"
        );
        assert!(line.contains("eager: out [2, 512] x 2 layers"), "{line}");
        let sum: f64 = number_after(line, "checksum ");
        assert!(sum.is_finite(), "{line}");
    }
    assert!(
        out.contains("steps: 1 extend + 3 decode; device errors: 0 event(s)"),
        "{out}"
    );
}

#[test]
fn ex04_replay_finishes_every_request() {
    let out = ex04::run(false).unwrap();
    assert!(out.contains("executor cpu (2 layers of tiny)"), "{out}");
    assert!(out.contains("8 requests replayed, 8 finished"), "{out}");
    let steps: u64 = number_after(&out, "scheduler steps: ");
    // Every request generates at least one token, so there is at least one
    // prefill step, and the passes are at least the steps.
    let passes: u64 = number_after(&out, "passes: ");
    assert!(steps > 0 && passes >= steps, "{out}");
    let pairs: u64 = number_after(&out, "checked: ");
    assert!(pairs > 0, "{out}");
    assert!(out.contains(" 0 mismatched; device errors: 0"), "{out}");
}
