#!/usr/bin/env python3
"""The instructions of a worker round in memory, counted by callgrind, against a baseline.

    python3 .ci/instructions.py BUILD target/release/examples/profile_iteration           # check
    python3 .ci/instructions.py BUILD target/release/examples/profile_iteration --update  # new baseline

BUILD names the build the counts are of (`default`: the default features; `all`: every
feature), each with its own baseline.

`profile_iteration W N auto` runs a job of W workers whose compute does nothing for N
iterations, the whole job on its coordination thread; `... auto traced` runs it under a
`tracing` subscriber that records INFO and above (counted as "W traced"), so that what
the spans nobody records cost a round is checked too. The instructions of a worker round
are the difference between two runs of N1 and N2 iterations over (N2 - N1) x W: start-up
and shutdown cancel out. Two runs of the same build agree within 0.2%; timings on a shared
machine do not come near that, so this is the check that the round did not grow.

Fails (exit 1) when a count is more than 5% above the baseline in `.ci/instructions.json`.
The counts are of the code one compiler made: with another `rustc` than the baseline's, it
prints both and passes (run `--update` on the new compiler's first green commit).
"""

import json
import os
import re
import subprocess
import sys

BASELINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "instructions.json")
# (workers, fewer iterations, more iterations, under a subscriber)
RUNS = [(16, 1000, 3000, False), (256, 100, 300, False), (256, 100, 300, True)]
TOLERANCE = 1.05


def collected(binary, workers, iterations, traced):
    """The instructions callgrind counts in one run of the job."""
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            binary,
            str(workers),
            str(iterations),
            "auto",
        ]
        + (["traced"] if traced else []),
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(
            f"{binary} {workers} {iterations} auto{' traced' if traced else ''} failed under callgrind "
            f"(exit {out.returncode}):\n{out.stdout}\n{out.stderr}"
        )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if not found:
        sys.exit(
            f"callgrind gave no count for {workers} workers{' traced' if traced else ''}:\n{out.stderr}"
        )
    return int(found.group(1))


def per_worker_round(binary, workers, fewer, more, traced):
    return (
        collected(binary, workers, more, traced) - collected(binary, workers, fewer, traced)
    ) / (
        (more - fewer) * workers
    )


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    build, binary = args
    rustc = subprocess.run(
        ["rustc", "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    counts = {
        f"{workers} traced" if traced else str(workers): round(
            per_worker_round(binary, workers, fewer, more, traced), 1
        )
        for workers, fewer, more, traced in RUNS
    }
    try:
        with open(BASELINE) as f:
            baselines = json.load(f)
    except FileNotFoundError:
        baselines = {}
    if "--update" in sys.argv:
        baselines[build] = {"rustc": rustc, "per_worker_round": counts}
        with open(BASELINE, "w") as f:
            json.dump(baselines, f, indent=2, sort_keys=True)
            f.write("\n")
        print(f"baseline of the {build} build written: {counts} ({rustc})")
        return
    baseline = baselines.get(build)
    if baseline is None:
        sys.exit(f"no baseline for the {build} build in {BASELINE}: run with --update")
    grown = []
    for workers, count in counts.items():
        base = baseline["per_worker_round"].get(workers)
        if not base:
            sys.exit(f"the {build} build's baseline has no count at {workers} workers: run with --update")
        ratio = count / base
        print(
            f"{build} build, {workers} workers: {count:.1f} instructions a worker round, "
            f"baseline {base} ({ratio:.3f}x)"
        )
        if ratio > TOLERANCE:
            grown.append(workers)
    if baseline["rustc"] != rustc:
        print(
            f"the baseline was counted on {baseline['rustc']}, this is {rustc}: "
            "not compared (update the baseline on this compiler)"
        )
        return
    if grown:
        sys.exit(
            f"a worker round of the {build} build grew more than {TOLERANCE - 1:.0%} at "
            f"{', '.join(grown)} workers: find where (PERFORMANCE.md, 'Measuring'), or if it earns its place, "
            "say so in the commit and run with --update"
        )


if __name__ == "__main__":
    main()
