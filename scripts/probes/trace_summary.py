"""Summarise the decode bench's per-CTA traces (MHA_KIT_BENCH_DECODE_TRACE).

Each CSV has one row per CTA with nanoseconds from the launch's first CTA
entry to each stamp (-1 where a CTA did not reach it). For the CTAs that
streamed keys (first_kv >= 0) this prints the median and 90th percentile of
each phase: start (entry -> first K/V tile landed), stream (first tile ->
loop end), end (loop end -> exit), and the launch span (last exit).

    python3 scripts/probes/trace_summary.py DIR_OR_CSV...
"""
import csv
import os
import sys


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summarise(path):
    with open(path) as f:
        rows = [{k: int(v) for k, v in r.items()} for r in csv.DictReader(f)]
    work = [r for r in rows if r["first_kv"] >= 0 and r["exit"] >= 0]
    phases = {
        "start": [r["first_kv"] - r["entry"] for r in work],
        "stream": [r["loop_end"] - r["first_kv"] for r in work],
        "end": [r["exit"] - r["loop_end"] for r in work],
    }
    span = max((r["exit"] for r in rows if r["exit"] >= 0), default=0)
    cells = "  ".join(
        f"{k} {pct(v, 0.5) / 1e3:.2f} / {pct(v, 0.9) / 1e3:.2f} us" for k, v in phases.items()
    )
    print(f"{os.path.basename(path)}: {len(work)} of {len(rows)} CTAs streamed; "
          f"median / p90: {cells}; span {span / 1e3:.1f} us")


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
