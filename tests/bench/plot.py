"""Plots of `make bench`'s controller figures, drawn with matplotlib.

Usage: plot.py DIR

Reads DIR/p6-calls.csv (policy, second, answered, throttled: EC2 calls of
the 1,000-volume run under EC2's request limits, per second of EC2 time)
and DIR/p7-latency.csv (rpc, ms: each RPC's latency with batching on), as
controller/src/service/tests/benches.rs writes them, and writes
DIR/p6-throttling.svg and DIR/p7-latency.svg.
"""

import csv
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def throttling(out, data):
    policies = list(dict.fromkeys(r["policy"] for r in data))
    fig, axes = plt.subplots(len(policies), 1, figsize=(9, 3.2 * len(policies)), sharex=True, squeeze=False)
    for ax, policy in zip(axes[:, 0], policies):
        mine = [r for r in data if r["policy"] == policy]
        seconds = [int(r["second"]) for r in mine]
        ax.plot(seconds, [int(r["answered"]) for r in mine], label="answered", color="tab:blue")
        ax.plot(seconds, [int(r["throttled"]) for r in mine], label="RequestLimitExceeded", color="tab:red")
        ax.set_title(policy)
        ax.set_ylabel("EC2 calls per second")
        ax.legend(loc="upper right")
    axes[-1, 0].set_xlabel("EC2 time (s)")
    fig.tight_layout()
    fig.savefig(out / "p6-throttling.svg")


def latency(out, data):
    samples = defaultdict(list)
    for r in data:
        samples[r["rpc"]].append(float(r["ms"]))
    fig, ax = plt.subplots(figsize=(9, 3.5))
    names = list(samples)
    ax.boxplot([samples[n] for n in names], orientation="horizontal", showfliers=True)
    ax.set_yticks(range(1, len(names) + 1), names)
    ax.set_xlabel("latency (ms), batching on")
    fig.tight_layout()
    fig.savefig(out / "p7-latency.svg")


def main():
    out = Path(sys.argv[1])
    throttling(out, rows(out / "p6-calls.csv"))
    latency(out, rows(out / "p7-latency.csv"))
    print(f"plots written to {out}/p6-throttling.svg and p7-latency.svg")


if __name__ == "__main__":
    main()
