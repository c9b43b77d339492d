#!/usr/bin/env bash
# examples/pagerank.rs on an emulated cluster: N hosts in network namespaces h0..h(N-1),
# 10.77.0.(k+1), each link shaped to a rate in both directions — as made by
# ../shared/cluster-emulation/setup.sh (root): `setup.sh 8 1gbit 0`.
#
#   benches/cluster/pagerank.sh [SUPERSTEPS] [-- EXTRA FLAGS OF THE EXAMPLE...]
#
# Runs rank r of n on host h<r> (rank 0, which also runs the master, on h0), for n in NS
# (default 2 4 8); prints one line per run from rank 0:
#   pagerank n=<n> superstep_ms=<median> messages=<per superstep> combined=<…> bytes=<…>
#            wire_bytes=<…> wire_ratio=<wire_bytes / bytes>
# superstep_ms is the median of the supersteps after the first and before the last (the
# first builds nothing the others do not, the last gathers every rank at the master).
# wire_bytes is what the hosts' links sent per superstep: the run's bytes sent by every
# host's eth0 (IP headers included) at SUPERSTEPS, less those at 2 supersteps, divided by
# SUPERSTEPS - 2 — what the set-up, the graph's first shares and the last gather cost
# cancels out. bytes is the report's encoded messages per superstep.
# Build first: cargo build --release --example pagerank
set -euo pipefail
cd "$(dirname "$0")/../.."
SUPERSTEPS=${1:-12}
shift || true
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
BIN=${BIN:-target/release/examples/pagerank}
NS=${NS:-"2 4 8"}
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release --example pagerank" >&2; exit 1; }
ip netns list | grep -qw h0 || { echo "no emulated cluster: ../shared/cluster-emulation/setup.sh 8 1gbit 0" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# The bytes hosts h0..h(n-1) have sent on their links.
sent() {
  local total=0
  for r in $(seq 0 $(($1 - 1))); do
    total=$((total + $(ip netns exec "h$r" cat /sys/class/net/eth0/statistics/tx_bytes)))
  done
  echo "$total"
}

# Runs the job on n hosts for s supersteps; leaves rank 0's output in $out/0.out and
# prints the bytes the hosts sent.
run() {
  local n=$1 s=$2 pids=() failed=0 before
  before=$(sent "$n")
  # Workers first, then the master: none waits long for it.
  for r in $(seq $((n - 1)) -1 0); do
    ip netns exec "h$r" env SUPERSTEP_RANK="$r" SUPERSTEP_WORLD_SIZE="$n" \
      SUPERSTEP_MASTER_ADDR=10.77.0.1:29500 SUPERSTEP_SECRET=bench SUPERSTEP_BIND=0.0.0.0 \
      timeout 900 "$BIN" --supersteps "$s" --no-check "${EXTRA[@]}" >"$out/$r.out" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  if [ "$failed" = 1 ]; then
    echo "pagerank n=$n supersteps=$s FAILED:" >&2
    for f in "$out"/*.out; do echo "== $f" >&2; tail -n 5 "$f" >&2; done
    return 1
  fi
  echo $(($(sent "$n") - before))
}

for n in $NS; do
  short=$(run "$n" 2)
  long=$(run "$n" "$SUPERSTEPS")
  # The superstep table: "superstep messages combined bytes time".
  awk -v n="$n" -v s="$SUPERSTEPS" -v wire="$(((long - short) / (SUPERSTEPS - 2)))" '
    $1 ~ /^[0-9]+$/ && NF == 5 {
      t = $5; ms = t + 0
      if (t ~ /µs$/) ms = ms / 1000; else if (t ~ /ms$/) ms = ms; else if (t ~ /s$/) ms = ms * 1000
      if ($1 > 1 && $1 < s) times[++k] = ms
      msgs = $2; comb = $3; bytes = $4
    }
    END {
      for (i = 2; i <= k; i++) for (j = i; j > 1 && times[j - 1] > times[j]; j--) {
        x = times[j]; times[j] = times[j - 1]; times[j - 1] = x
      }
      med = (k % 2) ? times[(k + 1) / 2] : (times[k / 2] + times[k / 2 + 1]) / 2
      printf "pagerank n=%d superstep_ms=%.1f messages=%d combined=%d bytes=%d wire_bytes=%d wire_ratio=%.3f\n",
        n, med, msgs, comb, bytes, wire, wire / bytes
    }' "$out/0.out"
done
