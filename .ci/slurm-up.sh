#!/usr/bin/env bash
# A one-node Slurm cluster on this host, for the tests that submit the README's sbatch
# recipe (tests/slurm.rs): Slurm and munge from Debian's packages, no systemd needed.
# Idempotent: installs what is missing, (re)uses the munge key, rewrites the config,
# starts munged, slurmctld and slurmd where they are not running, and waits for the node
# to be idle. As root. `.ci/slurm-down.sh` stops it all.
# Env knobs:
#   SLURM_NODE_CPUS   CPUs advertised for the node (default: max(nproc, 8)); more than the
#                     real count is allowed thanks to SlurmdParameters=config_overrides.
#   SLURM_CRED_EXPIRE AuthInfo cred_expire seconds = delay before a requeued job may start
#                     again (Slurm default 120; here 5, the least accepted: a value
#                     < 5 is rejected with "error: AuthInfo=cred_expire=4 invalid" and 120 is used).
#   SLURM_REQUEUE_EXIT  optional RequeueExit= list (e.g. 75): batch exit codes that requeue the job.
#   SLURM_UP_CLEAN=1  forget all jobs/state from earlier runs (wipes StateSaveLocation).
#   SLURM_UP_TIMEOUT  seconds to wait for the node to become idle (default 60).
set -euo pipefail

NODE=$(hostname -s)
NCPU=$(nproc)
CPUS=${SLURM_NODE_CPUS:-$(( NCPU > 8 ? NCPU : 8 ))}
CRED_EXPIRE=${SLURM_CRED_EXPIRE:-5}
((CRED_EXPIRE >= 5)) || CRED_EXPIRE=5
TIMEOUT=${SLURM_UP_TIMEOUT:-60}
LOGDIR=/var/log/slurm

log() { echo "[slurm-up] $*" >&2; }
if [ "$(id -u)" != 0 ]; then log "must run as root"; exit 1; fi

# 1. install (only what is missing)
need=()
for p in munge slurmctld slurmd slurm-client; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p")
done
if ((${#need[@]})); then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${need[@]}" >/tmp/slurm-up-apt.log 2>&1 || {
    apt-get update -q >/dev/null 2>&1 || true
    apt-get install -y -q --no-install-recommends "${need[@]}" >/tmp/slurm-up-apt.log 2>&1 \
      || { cat /tmp/slurm-up-apt.log >&2; exit 1; }
  }
fi

# host name must resolve (slurmd looks up NodeName / NodeHostname)
if ! getent hosts "$NODE" >/dev/null; then
  echo "127.0.0.1 $NODE" >> /etc/hosts
fi

# 2. munge key + munged (run as user munge: as root munged refuses the munge-owned
#    /var/log/munge: "Logfile is insecure: invalid ownership")
install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge
install -d -o munge -g munge -m 0711 /var/lib/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  log "creating munge key"
  if command -v mungekey >/dev/null; then
    mungekey --create --keyfile=/etc/munge/munge.key --force
  else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged"
  rm -f /run/munge/munged.pid
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || { log "munge not working"; tail -20 /var/log/munge/munged.log >&2; exit 1; }
fi

# 3. config
install -d -m 0755 /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOGDIR"
conf=$(cat <<CONF
# written by .ci/slurm-up.sh
ClusterName=ci
SlurmctldHost=${NODE}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also = how long a requeued job must wait before it can start again (default 120 s)
AuthInfo=cred_expire=${CRED_EXPIRE}
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# a requeued job becomes eligible at requeue+cred_expire+1 s but is only started by the next
# periodic pass (backfill every 30 s, main loop every 60 s by default): poll every second
SchedulerParameters=bf_interval=1,sched_interval=1
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# accept more CPUs in NodeName than the hardware has (lets --ntasks=4 run on 2 cores)
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=${LOGDIR}/slurmctld.log
SlurmdLogFile=${LOGDIR}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldPort=6817
SlurmdPort=6818
# faster reaction in a CI box
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
MessageTimeout=10
# RequeueExit (batch exit codes that requeue the job automatically):
${SLURM_REQUEUE_EXIT:+RequeueExit=${SLURM_REQUEUE_EXIT}}
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${CPUS} State=UNKNOWN
PartitionName=debug Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
)
if [ "$(cat /etc/slurm/slurm.conf 2>/dev/null)" != "$conf" ]; then
  printf '%s\n' "$conf" > /etc/slurm/slurm.conf
  changed=1
else
  changed=0
fi

# a pid from a pid file counts only if it is a live (non-zombie) process: PID 1 here is not
# an init that reaps at once, so a stopped daemon can linger as a zombie and kill -0 succeeds
alive() {
  local pid; pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}

# a changed slurm.conf: restart (some settings, e.g. AuthInfo cred_expire, are read only at start,
# "scontrol reconfigure" does not apply them)
if ((changed)) && { alive /run/slurmctld.pid || alive /run/slurmd.pid; }; then
  log "config changed: restarting slurm daemons"
  scontrol shutdown >/dev/null 2>&1 || true
  for _ in $(seq 100); do alive /run/slurmctld.pid || alive /run/slurmd.pid || break; sleep 0.2; done
  for f in /run/slurmctld.pid /run/slurmd.pid; do alive "$f" && kill -KILL "$(cat "$f")" 2>/dev/null || true; done
fi

if [ "${SLURM_UP_CLEAN:-0}" = 1 ] && ! alive /run/slurmctld.pid; then
  rm -rf /var/spool/slurmctld/* /var/spool/slurmd/*
fi

# 4. daemons (they daemonize themselves when started without -D)
if ! alive /run/slurmctld.pid; then
  log "starting slurmctld"
  /usr/sbin/slurmctld
fi
if ! alive /run/slurmd.pid; then
  log "starting slurmd"
  /usr/sbin/slurmd
fi

# 5. wait for idle
deadline=$((SECONDS + TIMEOUT))
while :; do
  # %t = short state; a trailing '*' means slurmd has not (re)registered / is not responding
  state=$(sinfo -h -N -n "$NODE" -o '%t' 2>/dev/null | head -1 || true)
  case "$state" in
    idle|mix|alloc) break ;;
    down|drain|drng|fail|failg|inval)
      # e.g. left DOWN from a previous unclean stop
      scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
  esac
  if ((SECONDS >= deadline)); then
    log "timeout: node state '${state}'"
    sinfo -N -l >&2 || true
    tail -20 "$LOGDIR/slurmctld.log" "$LOGDIR/slurmd.log" >&2 || true
    exit 1
  fi
  sleep 0.5
done
log "ready: node $NODE is $state ($(sinfo -V))"
