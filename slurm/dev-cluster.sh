#!/usr/bin/env bash
# A real one-node Slurm for development and the test tier that needs it.
#   slurm/dev-cluster.sh start   install (Debian packages, as root) if missing, configure, start
#   slurm/dev-cluster.sh stop    stop the daemons this script started
#   slurm/dev-cluster.sh status
# Idempotent. No systemd: munged, slurmctld and slurmd run as plain daemons, stopped by their pids.
set -euo pipefail
STATE=${DAPPLE_SLURM_STATE:-/var/tmp/dapple-slurm}
CONF=/etc/slurm/slurm.conf
HOST=$(hostname -s)
CPUS=${DAPPLE_SLURM_CPUS:-4}   # more task slots than cores is fine for gloo tests (one thread each)

install() {
  command -v slurmctld >/dev/null && command -v sbatch >/dev/null && command -v munged >/dev/null && return
  [ "$(id -u)" = 0 ] || { echo "installing Slurm needs root (apt-get)"; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
}

configure() {
  mkdir -p /etc/slurm "$STATE"/{ctld,d,log} /run/munge /var/log/munge /var/lib/munge /etc/munge
  chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge 2>/dev/null || true
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null;
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  cat > "$CONF" <<CONFEOF
ClusterName=dapple-dev
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmdSpoolDir=$STATE/d
StateSaveLocation=$STATE/ctld
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
MinJobAge=300
KillWait=10
NodeName=$HOST CPUs=$CPUS RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONFEOF
}

running() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

start() {
  install
  configure
  if ! pgrep -x munged >/dev/null; then
    sudo_munge="munged --force"
    $sudo_munge 2>/dev/null || runuser -u munge -- munged --force
  fi
  running slurmctld || slurmctld -i
  running slurmd || slurmd
  for _ in $(seq 60); do
    sinfo -h -o %T 2>/dev/null | grep -qE "idle|mixed|allocated" && { echo "slurm up: $(sinfo -h -o '%P %D %T')"; return; }
    scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  echo "slurm did not come up; see $STATE/log/"; sinfo || true; exit 1
}

stop() {
  for d in slurmd slurmctld; do
    if running $d; then kill "$(cat "$STATE/$d.pid")"; fi
  done
  pkill -x munged 2>/dev/null || true
  echo "slurm stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) sinfo && squeue ;;
  *) echo "usage: $0 start|stop|status"; exit 2 ;;
esac
