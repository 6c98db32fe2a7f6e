"""FedPEFT's Table 2 direction from a report's results.csv: each codec against the full table.

For each (dataset, protocol, method) and codec: sampled and full HR@10 at the last
round, mean ± std over the seeds found (ddof 1), the upload per client per round (the
last round's, the codec's steady state, and the mean over all rounds, warm-up
included), the sampled HR@10 as a share of the same method's full-table run, and
whether the difference from the full table exceeds seed noise (twice its standard
error, :func:`benchmarks.common.seed_noise`).

    python -m benchmarks.codec_table benchmarks/results/utility/codecs/results.csv
"""

from __future__ import annotations

import argparse

import pandas as pd

from fedem_private.experiments.analysis import no_privacy

from .common import fmt_mean_std, mean_std, seed_noise

CODECS = ("full", "lora", "hash", "rqvae", "c-lora")


def _mean_std(values: pd.Series) -> tuple[float, float, int]:
    return mean_std(values.dropna().tolist())


def codec_rows(results: pd.DataFrame) -> list[str]:
    """The markdown table's rows (header included)."""
    lines = ["| dataset | protocol | method | codec | seeds | sampled HR@10 | full HR@10 | "
             "KB up / round (last; mean over rounds) | vs full (sampled) | "
             "difference from full (2 s.e.) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    private = results[~results["mode"].map(no_privacy).astype(bool)]
    if len(private):
        raise SystemExit("codec_table: the results hold private runs; give it a no-privacy grid")
    for (dataset, protocol, method), group in results.groupby(["dataset", "protocol", "method"]):
        base = group[group["codec"] == "full"]["hr10_sampled"]
        bm, bs, bn = _mean_std(base)
        for codec in [c for c in CODECS if c in set(group["codec"])]:
            rows = group[group["codec"] == codec]
            sm, ss, n = _mean_std(rows["hr10_sampled"])
            fm, fs, _ = _mean_std(rows["hr10_full"])
            kb = f"{rows['bytes_up_last'].mean() / 1000:.1f}; {rows['bytes_up'].mean() / 1000:.1f}"
            share = f"{100 * sm / bm:.0f}%" if bn else "-"
            verdict = ""
            if codec != "full" and n > 1 and bn > 1:
                diff, two_se, beyond = seed_noise(sm, ss, n, bm, bs, bn)
                verdict = f"{diff:+.4f} ({two_se:.4f}), {'beyond' if beyond else 'within'}"
            lines.append(f"| {dataset} | {protocol} | {method} | {codec} | {n} | "
                         f"{fmt_mean_std(sm, ss)} | {fmt_mean_std(fm, fs)} | {kb} | {share} | "
                         f"{verdict} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="results.csv written by `fedem-private report`")
    args = ap.parse_args(argv)
    print("\n".join(codec_rows(pd.read_csv(args.results))))


if __name__ == "__main__":
    main()
