"""Summarise the decode bench's per-CTA traces (MHA_KIT_BENCH_DECODE_TRACE).

Each CSV has one row per CTA with nanoseconds from the launch's first CTA
entry to each stamp (-1 where a CTA did not reach it). For the CTAs that
streamed keys (first_kv >= 0) this prints the median and 90th percentile of
each phase: rank (the length order's ranking, in traces with a `rank`
column: session 48 on), start (entry -> first K/V tile landed; from session
48 on the entry is taken before the ranking, so start includes it), stream
(first tile -> loop end), end (loop end -> exit), and the launch span (last
exit). Then the empty CTAs (length order: no unit; count and median life),
the share of SM time with 0, 1, 2, ... CTAs streaming (first tile -> loop
end) and resident (entry -> exit), and the fixed share: start + end over
the CTAs' whole lives.

    python3 scripts/probes/trace_summary.py DIR_OR_CSV...
"""
import collections
import csv
import os
import sys


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def occupancy(rows, span, first, last):
    """Share of SM time (over the launch span) with k intervals open."""
    by_sm = collections.defaultdict(list)
    for r in rows:
        by_sm[r["sm"]].append((r[first], r[last]))
    share = collections.Counter()
    for ivs in by_sm.values():
        ev = sorted([(a, 1) for a, _ in ivs] + [(b, -1) for _, b in ivs])
        k, t0 = 0, 0
        for t, d in ev:
            share[k] += t - t0
            k += d
            t0 = t
        share[k] += span - t0
    total = sum(share.values()) or 1
    return "  ".join(f"{k}: {v / total:.3f}" for k, v in sorted(share.items()))


def summarise(path):
    with open(path) as f:
        rows = [{k: int(v) for k, v in r.items()} for r in csv.DictReader(f)]
    work = [r for r in rows if r["first_kv"] >= 0 and r["exit"] >= 0]
    phases = {}
    if rows and "rank" in rows[0]:
        phases["rank"] = [r["rank"] for r in work]
    phases["start"] = [r["first_kv"] - r["entry"] for r in work]
    phases["stream"] = [r["loop_end"] - r["first_kv"] for r in work]
    phases["end"] = [r["exit"] - r["loop_end"] for r in work]
    span = max((r["exit"] for r in rows if r["exit"] >= 0), default=0)
    cells = "  ".join(
        f"{k} {pct(v, 0.5) / 1e3:.2f} / {pct(v, 0.9) / 1e3:.2f} us" for k, v in phases.items()
    )
    print(f"{os.path.basename(path)}: {len(work)} of {len(rows)} CTAs streamed; "
          f"median / p90: {cells}; span {span / 1e3:.1f} us")
    empty = [r for r in rows if r["fold"] == 2 and r["entry"] >= 0 and r["exit"] >= 0]
    if empty:
        life = [r["exit"] - r["entry"] for r in empty]
        print(f"  {len(empty)} CTAs without work: life median / p90 {pct(life, 0.5) / 1e3:.2f} / "
              f"{pct(life, 0.9) / 1e3:.2f} us, {sum(life) / 1e3:.0f} CTA-us in all")
    lived = [r for r in rows if r["entry"] >= 0 and r["exit"] >= 0]
    print(f"  SM time by CTAs streaming: {occupancy(work, span, 'first_kv', 'loop_end')}")
    print(f"  SM time by CTAs resident:  {occupancy(lived, span, 'entry', 'exit')}")
    fixed = sum(r["first_kv"] - r["entry"] + r["exit"] - r["loop_end"] for r in work)
    whole = sum(r["exit"] - r["entry"] for r in lived) or 1
    print(f"  fixed share (start + end of working CTAs over all CTA lives): {fixed / whole:.3f}")


def main(args):
    paths = []
    for a in args:
        if os.path.isdir(a):
            paths += sorted(os.path.join(a, n) for n in os.listdir(a) if n.endswith(".csv"))
        else:
            paths.append(a)
    for p in paths:
        summarise(p)


if __name__ == "__main__":
    main(sys.argv[1:])
