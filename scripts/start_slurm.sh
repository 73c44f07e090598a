#!/usr/bin/env bash
# A one-machine Slurm cluster for the tests and CI (tests/integration/test_slurm_*.py), started as
# .ci/run starts PostgreSQL and Redis: install Debian's packages if missing, write a minimal
# slurm.conf for this host, start munged, slurmctld and the slurmd(s), wait until `sinfo` shows
# the nodes idle. Idempotent: a cluster that already answers with idle nodes is left alone.
#
# The cluster: two emulated nodes on this host, twinkle1 and twinkle2 (one slurmd each, on their
# own ports), so a 2-node job gets a real 2-node allocation. Two partitions: `twinkle` (the
# default) and `urgent`, whose jobs preempt `twinkle` jobs by requeueing them (PreemptMode
# REQUEUE), which is how the tests preempt a job. Needs root (it writes /etc/slurm).
#
#   scripts/start_slurm.sh            start it (or leave a running one alone)
#   scripts/start_slurm.sh --running  exit 0 when it already answers with idle nodes
#   scripts/start_slurm.sh --stop     stop its daemons (slurmd, slurmctld, munged)
set -euo pipefail

NODES=(twinkle1 twinkle2)
PORTS=(6818 6819)
CPUS_PER_NODE=${TWINKLE_SLURM_CPUS_PER_NODE:-2}
CONF=/etc/slurm/slurm.conf
STATE=/var/lib/twinkle-slurm
LOGS=/var/log/twinkle-slurm

cluster_ready() {
  local idle
  idle=$(sinfo -h -N -p twinkle -o '%N %t' 2>/dev/null | awk '$2 == "idle" || $2 == "mix" || $2 == "alloc"' | wc -l)
  [ "$idle" -eq "${#NODES[@]}" ]
}

is_up() {
  command -v sinfo >/dev/null && [ -f "$CONF" ] && grep -q '^ClusterName=twinkle' "$CONF" && cluster_ready
}

stop_daemon() {  # a pid file's process: TERM, then wait for it to go (KILL after 10 s)
  local pid
  [ -f "$1" ] || return 0
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
}

case "${1:-}" in
  --running) is_up; exit ;;
  --stop)
    for node in "${NODES[@]}"; do stop_daemon "$STATE/slurmd-$node.pid"; done
    stop_daemon "$STATE/slurmctld.pid"
    stop_daemon /run/munge/munged.pid
    exit 0
    ;;
  "") ;;
  *) echo "usage: $0 [--running | --stop]" >&2; exit 2 ;;
esac

if is_up; then
  exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
fi

host=$(hostname -s)
mkdir -p /etc/slurm "$STATE/ctld" "$LOGS"
for node in "${NODES[@]}"; do mkdir -p "$STATE/$node"; done

# Nodes are declared with more CPUs than a small CI machine may have (config_overrides: slurmd
# trusts the file instead of draining the node); jobs are processes on this one host anyway.
{
  echo "ClusterName=twinkle"
  echo "SlurmctldHost=$host(127.0.0.1)"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "StateSaveLocation=$STATE/ctld"
  echo "SlurmdSpoolDir=$STATE/%n"
  echo "SlurmctldPidFile=$STATE/slurmctld.pid"
  echo "SlurmdPidFile=$STATE/slurmd-%n.pid"
  echo "SlurmctldLogFile=$LOGS/slurmctld.log"
  echo "SlurmdLogFile=$LOGS/slurmd-%n.log"
  echo "SlurmdParameters=config_overrides"
  # No cgroups in a container: track job processes through /proc, bind no tasks to cores.
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_CPU"
  echo "SchedulerType=sched/backfill"
  echo "PreemptType=preempt/partition_prio"
  echo "PreemptMode=REQUEUE"
  echo "ReturnToService=2"
  # Short timers: a test preempts, requeues and cancels within seconds. Finished jobs stay
  # visible to `scontrol show job` for MinJobAge seconds (there is no accounting database here).
  echo "SchedulerParameters=sched_interval=2,bf_interval=2"
  echo "MinJobAge=600"
  echo "KillWait=5"
  echo "SlurmdTimeout=30"
  echo "MessageTimeout=10"
  echo "InactiveLimit=0"
  for i in "${!NODES[@]}"; do
    echo "NodeName=${NODES[$i]} NodeHostname=$host NodeAddr=127.0.0.1 Port=${PORTS[$i]} CPUs=$CPUS_PER_NODE RealMemory=4000 State=UNKNOWN"
  done
  nodelist=$(IFS=,; echo "${NODES[*]}")
  echo "PartitionName=twinkle Nodes=$nodelist Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE"
  echo "PartitionName=urgent Nodes=$nodelist MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF"
} >"$CONF.new"
changed=1
if [ -f "$CONF" ] && cmp -s "$CONF" "$CONF.new"; then changed=0; fi
mv "$CONF.new" "$CONF"
chmod 644 "$CONF"

# munge: a key (the package makes one; make it if it did not), then the daemon as its own user.
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
fi

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if [ "$changed" = 1 ]; then  # a new configuration: restart what runs with the old one
  for pidfile in "$STATE"/slurmd-*.pid "$STATE/slurmctld.pid"; do
    if running "$pidfile"; then kill "$(cat "$pidfile")"; sleep 1; fi
  done
fi
if ! running "$STATE/slurmctld.pid"; then
  slurmctld
fi
for node in "${NODES[@]}"; do
  if ! running "$STATE/slurmd-$node.pid"; then
    slurmd -N "$node"
  fi
done

for _ in $(seq 60); do
  if cluster_ready; then exit 0; fi
  # A node that was down (a previous run of this script, a killed slurmd) comes back here.
  scontrol update NodeName="$(IFS=,; echo "${NODES[*]}")" State=RESUME >/dev/null 2>&1 || true
  sleep 1
done
echo "Slurm did not come up: sinfo says" >&2
sinfo -N >&2 || true
tail -n 20 "$LOGS"/*.log >&2 || true
exit 1
