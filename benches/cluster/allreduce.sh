#!/usr/bin/env bash
# examples/allreduce.rs on an emulated cluster: N hosts in network namespaces h0..h(N-1),
# 10.77.0.(k+1), each link shaped to a rate in both directions — as made by
# ../shared/cluster-emulation/setup.sh (root): `setup.sh 8 1gbit 0`.
#
#   benches/cluster/allreduce.sh [ITERATIONS] [NS...] [-- MB...]
#
# Runs rank r of n on host h<r> (rank 0, the master, on h0), for n in 2 4 8, S in 1 8 MB,
# every mode (MODES: all-reduce barrier star fold; CALLS calls a compute, default 1); prints each run's line from rank 0:
#   allreduce mode=<mode> n=<n> mb=<S> median_ms=<ms>
# Build first: cargo build --release --example allreduce
set -euo pipefail
cd "$(dirname "$0")/../.."
ITERATIONS=${1:-10}
BIN=${BIN:-target/release/examples/allreduce}
MODES=${MODES:-"all-reduce barrier star fold"}
NS=${NS:-"2 4 8"}
MBS=${MBS:-"1 8"}
CALLS=${CALLS:-1}
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release --example allreduce" >&2; exit 1; }
ip netns list | grep -qw h0 || { echo "no emulated cluster: ../shared/cluster-emulation/setup.sh 8 1gbit 0" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for mode in $MODES; do
  for mb in $MBS; do
    for n in $NS; do
      pids=()
      # Workers first, then the master: none waits long for it.
      for r in $(seq $((n - 1)) -1 0); do
        ip netns exec "h$r" env SUPERSTEP_RANK="$r" SUPERSTEP_WORLD_SIZE="$n" \
          SUPERSTEP_MASTER_ADDR=10.77.0.1:29500 SUPERSTEP_SECRET=bench SUPERSTEP_BIND=0.0.0.0 \
          timeout 600 "$BIN" --mb "$mb" --iterations "$ITERATIONS" --mode "$mode" --calls "$CALLS" \
          >"$out/$r.out" 2>&1 &
        pids+=($!)
      done
      failed=0
      for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
      if [ "$failed" = 1 ]; then
        echo "allreduce mode=$mode n=$n mb=$mb FAILED:" >&2
        for f in "$out"/*.out; do echo "== $f" >&2; tail -n 5 "$f" >&2; done
      else
        grep '^allreduce ' "$out/0.out"
      fi
    done
  done
done
