#!/usr/bin/env bash
# Stops the one-node Slurm cluster `.ci/slurm-up.sh` started: cancels its jobs, stops
# slurmctld and slurmd, then munged. Idempotent. SLURM_DOWN_PURGE=1 also wipes the saved
# job state and the logs.
set -uo pipefail
log() { echo "[slurm-down] $*" >&2; }
alive() {
  local pid; pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}
wait_gone() { # timeout_s pidfile...
  local t=$1; shift
  for _ in $(seq $((t * 5))); do
    local any=0; for f in "$@"; do alive "$f" && any=1; done
    ((any)) || return 0; sleep 0.2
  done
  return 1
}

if alive /run/slurmctld.pid; then
  # jobs left running would keep their slurmstepd/tasks alive after slurmd exits
  jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    log "cancelling jobs: $jobs"
    scancel $jobs 2>/dev/null || true
    for _ in $(seq 100); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  log "scontrol shutdown"
  scontrol shutdown >/dev/null 2>&1 || true   # stops slurmctld and every slurmd
fi
if ! wait_gone 20 /run/slurmctld.pid /run/slurmd.pid; then
  log "daemons still alive after 20 s: SIGTERM"
  for f in /run/slurmctld.pid /run/slurmd.pid; do alive "$f" && kill -TERM "$(cat "$f")"; done
  wait_gone 10 /run/slurmctld.pid /run/slurmd.pid || \
    for f in /run/slurmctld.pid /run/slurmd.pid; do alive "$f" && kill -KILL "$(cat "$f")"; done
fi
# slurmd alone (slurmctld already gone): it ignores scontrol shutdown then
if alive /run/slurmd.pid; then kill -TERM "$(cat /run/slurmd.pid)"; wait_gone 10 /run/slurmd.pid; fi

if alive /run/munge/munged.pid; then
  log "stopping munged"
  munged --stop >/dev/null 2>&1 || kill -TERM "$(cat /run/munge/munged.pid)"
  wait_gone 10 /run/munge/munged.pid || kill -KILL "$(cat /run/munge/munged.pid)" 2>/dev/null
fi
if [ "${SLURM_DOWN_PURGE:-0}" = 1 ]; then
  rm -rf /var/spool/slurmctld/* /var/spool/slurmd/* /var/log/slurm/*.log
fi
log "stopped"
exit 0
