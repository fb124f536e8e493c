"""Plots the latency distributions of a `make bench` run (raw.json) as empirical CDFs.

usage: plot.py RAW_JSON OUT_PNG

Three panels on logarithmic time axes: floors, acquire and grant latency; voluntary
handoffs; failovers (with the lease durations marked). Each curve is one series of
raw.json, labelled with its n and p50/p99.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [
    ("fast", "Floors, uncontended acquire, grant latency"),
    ("handoff", "Voluntary handoff"),
    ("failover", "Failover (crash: SIGKILL / stop renewing; Pod deletion)"),
]


def fmt(ms):
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


def main(raw_path, out_path):
    with open(raw_path) as f:
        run = json.load(f)
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(11, 19))
    for ax, (panel, title) in zip(axes, PANELS):
        series = [s for s in run["series"] if s["panel"] == panel and s["samples_ms"]]
        for s in series:
            xs = sorted(v for v in s["samples_ms"] if v > 0)
            if not xs:
                continue
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            leasehold = s["subject"] == "Leasehold"
            summary = s["summary"]
            label = f"{s['title']} [{s['subject']}] n={summary['n']} p50 {fmt(summary['p50'])} p99 {fmt(summary['p99'])}"
            ax.step([xs[0]] + xs, [0.0] + ys, where="post", label=label, linewidth=2.2 if leasehold else 1.3,
                    linestyle="-" if leasehold else "--", marker="o" if len(xs) < 30 else None, markersize=3)
        if panel == "failover":
            for seconds in (15, 30):
                ax.axvline(seconds * 1000, color="grey", linewidth=0.8, linestyle=":")
                ax.text(seconds * 1000, 0.02, f" {seconds} s lease", color="grey", fontsize=7)
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("milliseconds (log scale)")
        ax.set_ylabel("fraction of samples ≤ x")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(0.0, -0.12), frameon=False)
    machine = run.get("facts", {}).get("machine", {})
    fig.suptitle(
        f"Leasehold `make bench` — {run.get('facts', {}).get('started_at', '')} — "
        f"{machine.get('nproc', '?')} cores, load avg at start {machine.get('loadavg_start', '?')}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    fig.savefig(out_path, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
