#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, for tests and CI: munge + slurmctld + slurmd from the Debian
# packages, started as plain background daemons (no systemd). Root only.
#
#   images/local/slurm-cluster.sh install   # apt packages (--no-install-recommends: 8 packages, not 43)
#   images/local/slurm-cluster.sh start     # write /etc/slurm/slurm.conf, start munged, slurmctld, slurmd;
#                                           # returns once the node is idle and a job has run
#   images/local/slurm-cluster.sh status    # the daemons' pids and sinfo
#   images/local/slurm-cluster.sh stop      # cancel every job, stop the daemons, leave no process or pid file
#
# Why each setting (measured on Debian 12, Slurm 22.05, munge 0.5.15; ../shared/reference/I-slurm.md):
# - SlurmctldHost and NodeAddr are 127.0.0.1, so nothing depends on DNS; the node line is `slurmd -C`'s own
#   (a hand-written CPUs= line makes slurmd complain about socket/core boundaries), with 95% of the memory.
# - DefMemPerCPU: with CR_Core_Memory and no default, every job is handed the whole node's memory and jobs
#   run one at a time.
# - proctrack/linuxproc + task/none: no cgroup set-up needed (cgroup v1 plugins also work; v2 hosts untested).
# - KillWait=10 (default 30): a cancelled or timed-out job gets SIGKILL 10 s after SIGTERM (5 s was too short on
#   two loaded cores for a run to record `interrupted` before the SIGKILL).
# - No accounting (sacct answers "accounting storage is disabled"): job states come from squeue/scontrol,
#   which keep a finished job for MinJobAge seconds.
# - No Epilog on purpose: the kit's own job scripts must remove their containers when cancelled, as they
#   must on a cluster whose epilog the user does not control.
# An existing /etc/slurm/slurm.conf that this script did not write (a real cluster's) is never touched.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
MARK="# Written by draftscope images/local/slurm-cluster.sh"
LOG_DIR=/var/log/slurm
STATE=/var/lib/slurm
PARTITION=${DRAFTSCOPE_SLURM_PARTITION:-debug}

alive() {  # a pid that exists and is not a zombie (PID 1 here reaps orphans late)
  local pid=$1 stat
  stat=$(ps -o stat= -p "$pid" 2>/dev/null) || return 1
  [ -n "$stat" ] && [ "${stat#Z}" = "$stat" ]
}

pid_of() {  # the pid in a pid file, if that process is alive
  [ -f "$1" ] || return 1
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  alive "$pid" && echo "$pid"
}

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
     && command -v munged >/dev/null; then
    return
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null; }
}

write_conf() {
  if [ -f "$CONF" ] && ! grep -qxF "$MARK" "$CONF"; then
    echo "$CONF exists and was not written by this script (a real cluster's?); not touching it" >&2
    exit 1
  fi
  local host node mem_kib real
  host=$(hostname -s)
  # slurmd -C: "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=N"
  node=$(slurmd -C | head -n 1)
  mem_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
  real=$((mem_kib * 95 / 100 / 1024))
  node=$(echo "$node" | sed -E "s/RealMemory=[0-9]+/RealMemory=$real/")
  mkdir -p /etc/slurm "$LOG_DIR" "$STATE/slurmctld" "$STATE/slurmd"
  chown slurm:slurm "$LOG_DIR" "$STATE/slurmctld"
  cat > "$CONF" <<CONF
$MARK
ClusterName=draftscope
SlurmctldHost=$host(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
KillWait=10
MinJobAge=300
InactiveLimit=0
MailProg=/bin/true
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
}

start_daemons() {
  if ! pid_of /run/munge/munged.pid >/dev/null; then
    install -d -o munge -g munge -m 0755 /run/munge  # systemd's RuntimeDirectory= would create it
    [ -f /etc/munge/munge.key ] || mungekey --create
    runuser -u munge -- /usr/sbin/munged
  fi
  munge -n | unmunge >/dev/null
  pid_of /run/slurmctld.pid >/dev/null || /usr/sbin/slurmctld
  pid_of /run/slurmd.pid >/dev/null || /usr/sbin/slurmd
  local state=""
  for _ in $(seq 300); do
    state=$(sinfo -h -o %T 2>/dev/null | head -n 1) || true
    case "$state" in
      idle|mixed|allocated) break ;;
      drain*|down*) scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.1
  done
  case "$state" in
    idle|mixed|allocated) ;;
    *) echo "the node did not come up (state '$state'); see $LOG_DIR/slurmctld.log and slurmd.log" >&2; exit 1 ;;
  esac
  # A job end to end, so that "started" means "runs jobs".
  local out
  out=$(srun -N1 -n1 --time=1 hostname 2>/dev/null) || { echo "srun failed; see $LOG_DIR/*.log" >&2; exit 1; }
  echo "slurm: node $out up, partition $PARTITION ($(sinfo -h -o '%c CPUs, %m MB' | head -n 1))"
}

stop_daemons() {
  if pid_of /run/slurmctld.pid >/dev/null; then
    local jobs
    jobs=$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ') || true
    if [ -n "${jobs// /}" ]; then
      # shellcheck disable=SC2086  # job ids, one word each
      scancel $jobs 2>/dev/null || true
      for _ in $(seq 150); do
        [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break
        sleep 0.2
      done
    fi
    scontrol shutdown >/dev/null 2>&1 || true
  fi
  local f pid i
  for f in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do
    # scontrol shutdown stops both Slurm daemons (munged has no such call): SIGTERM whatever still runs after
    # 3 s (munged at once), SIGKILL after 5 s.
    for i in $(seq 50); do
      pid=$(pid_of "$f") || break
      if [ "$i" = 30 ] || { [ "$i" = 1 ] && [ "$f" = /run/munge/munged.pid ]; }; then kill "$pid" 2>/dev/null || true; fi
      [ "$i" = 50 ] && { kill -9 "$pid" 2>/dev/null || true; }
      sleep 0.1
    done
    # A stale slurmctld pid file makes `apt-get purge slurmctld` fail (its prerm runs scancel).
    rm -f "$f"
  done
}

status() {
  local f
  for f in /run/munge/munged.pid /run/slurmctld.pid /run/slurmd.pid; do
    if pid=$(pid_of "$f"); then echo "$(basename "$f" .pid): $pid"; else echo "$(basename "$f" .pid): stopped"; fi
  done
  sinfo 2>/dev/null || true
}

[ "$(id -u)" = 0 ] || { echo "$0 needs root (it starts munged, slurmctld and slurmd)" >&2; exit 1; }
case "${1:-}" in
  install) install_packages ;;
  start) write_conf; start_daemons ;;
  status) status ;;
  stop) stop_daemons ;;
  *) echo "usage: $0 install|start|status|stop" >&2; exit 2 ;;
esac
