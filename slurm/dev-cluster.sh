#!/usr/bin/env bash
# A real development Slurm for development and the test tiers that need it.
#   slurm/dev-cluster.sh start [--nodes N] [--cpus-per-node C]
#                                 install (Debian packages, as root) if missing, configure, start;
#                                 N = 1 (default): one slurmd on this host; N > 1: one slurmd per Linux
#                                 network + UTS namespace (dapple-n1 … dapple-nN, 10.213.0.11 …) on a
#                                 bridge, slurmctld and munged here (FIELD-NOTES: a multi-node Slurm)
#   slurm/dev-cluster.sh stop    stop the daemons this script started; remove the namespaces and links
#   slurm/dev-cluster.sh status
#   slurm/dev-cluster.sh kill-node K   node K dies: its slurmd, slurmstepds and tasks, SIGKILL
#   slurm/dev-cluster.sh cut-link K    node K's link goes down (its processes live on, unreachable)
#   slurm/dev-cluster.sh heal-node K   node K back: link up, slurmd started, the node resumed
# Idempotent. No systemd: munged, slurmctld and slurmd run as plain daemons, stopped by their pids.
set -euo pipefail
STATE=${DAPPLE_SLURM_STATE:-/var/tmp/dapple-slurm}
CONF=/etc/slurm/slurm.conf
HOST=$(hostname -s)
CPUS=${DAPPLE_SLURM_CPUS:-4}   # more task slots than cores is fine for gloo tests (one thread each)
NODES=${DAPPLE_SLURM_NODES:-1}
BRIDGE=dapple-br0
NET=10.213.0

install() {
  command -v slurmctld >/dev/null && command -v sbatch >/dev/null && command -v munged >/dev/null && return
  [ "$(id -u)" = 0 ] || { echo "installing Slurm needs root (apt-get)"; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
}

node_lines() {
  if [ "$NODES" = 1 ]; then
    cat <<CONFEOF
SlurmctldHost=$HOST
SlurmdPidFile=$STATE/slurmd.pid
SlurmdSpoolDir=$STATE/d
SlurmdLogFile=$STATE/log/slurmd.log
NodeName=$HOST CPUs=$CPUS RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONFEOF
  else
    cat <<CONFEOF
SlurmctldHost=$HOST($NET.1)
SlurmdPidFile=$STATE/%n/slurmd.pid
SlurmdSpoolDir=$STATE/%n/spool
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmdTimeout=10
AuthInfo=cred_expire=10
NodeName=dapple-n[1-$NODES] NodeAddr=$NET.[11-$((10 + NODES))] CPUs=$CPUS RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=dapple-n[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONFEOF
  fi
}

configure() {
  mkdir -p /etc/slurm "$STATE"/{ctld,d,log} /run/munge /var/log/munge /var/lib/munge /etc/munge
  chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge 2>/dev/null || true
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null;
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  cat > "$CONF" <<CONFEOF
ClusterName=dapple-dev
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile=$STATE/slurmctld.pid
StateSaveLocation=$STATE/ctld
SlurmctldLogFile=$STATE/log/slurmctld.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
MinJobAge=300
KillWait=10
$(node_lines)
CONFEOF
  # slurmd inside a namespace sees /sys remounted without cgroups: nothing here needs them
  if [ "$NODES" = 1 ]; then rm -f /etc/slurm/cgroup.conf; else echo "CgroupPlugin=cgroup/v1" > /etc/slurm/cgroup.conf; fi
  echo "$NODES" > "$STATE/nodes"
}

# ---- N > 1: one namespace per node on a bridge ---------------------------------------------------
network() {
  ip link show "$BRIDGE" >/dev/null 2>&1 || {
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.1/24" dev "$BRIDGE"
  }
  ip link set "$BRIDGE" up
  local hosts="127.0.0.1 localhost
$NET.1 $HOST"
  for k in $(seq "$NODES"); do hosts="$hosts
$NET.$((10 + k)) dapple-n$k"; done
  for k in $(seq "$NODES"); do
    local ns=dapple-n$k
    if ! ip netns list | grep -qw "$ns"; then
      ip netns add "$ns"
      ip link add "dapple-v$k" type veth peer name eth0 netns "$ns"
      ip link set "dapple-v$k" master "$BRIDGE" up
      ip -n "$ns" addr add "$NET.$((10 + k))/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up   # no default route: a lookup that cannot succeed fails at once
    fi
    mkdir -p "/etc/netns/$ns" "$STATE/$ns/spool"
    echo "$hosts" > "/etc/netns/$ns/hosts"   # bind-mounted over /etc/hosts for everything started inside
  done
}

alive() {  # a pid that runs (pid 1 here reaps late: a zombie is not alive)
  [ -n "${1:-}" ] && [ -r "/proc/$1/stat" ] && ! awk '{print $3}' "/proc/$1/stat" | grep -q '[ZX]'
}

running() { [ -f "$STATE/$1.pid" ] && alive "$(cat "$STATE/$1.pid")"; }

munge_alive() {  # (a killed munged may linger as a zombie, which pgrep still lists)
  local pid
  for pid in $(pgrep -x munged); do alive "$pid" && return 0; done
  return 1
}

start_slurmds() {
  if [ "$NODES" = 1 ]; then
    running slurmd || slurmd
    return
  fi
  network
  for k in $(seq "$NODES"); do
    local ns=dapple-n$k
    running "$ns/slurmd" && continue
    ip netns exec "$ns" unshare --uts sh -c "hostname $ns && exec slurmd -N $ns"
  done
}

start() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) NODES=$2; shift 2 ;;
      --cpus-per-node) CPUS=$2; shift 2 ;;
      *) echo "unknown option $1"; exit 2 ;;
    esac
  done
  install
  configure
  if ! munge_alive; then
    munged --force 2>/dev/null || runuser -u munge -- munged --force
    pgrep -xn munged > "$STATE/munged.pid" || true
  fi
  running slurmctld || slurmctld -c   # -c: a clean start; jobs of an earlier start are not recovered
  start_slurmds
  for _ in $(seq 60); do
    if [ "$(sinfo -h -o %T 2>/dev/null | grep -cE 'idle|mixed|allocated')" -ge 1 ] &&
       [ "$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -cE 'idle|mixed|allocated')" -ge "$NODES" ]; then
      echo "slurm up: $(sinfo -h -o '%P %D %T')"; return
    fi
    if [ "$NODES" = 1 ]; then scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
    else scontrol update nodename="dapple-n[1-$NODES]" state=resume >/dev/null 2>&1 || true; fi
    sleep 1
  done
  echo "slurm did not come up; see $STATE/log/"; sinfo || true; exit 1
}

stop_pid() {  # SIGTERM, then wait for it to go (SIGKILL after 10 s)
  local pid=$1
  alive "$pid" || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do alive "$pid" || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

stop() {
  local nodes=1
  [ -f "$STATE/nodes" ] && nodes=$(cat "$STATE/nodes")
  [ -f "$STATE/slurmd.pid" ] && stop_pid "$(cat "$STATE/slurmd.pid")"
  for k in $(seq "$nodes"); do
    local ns=dapple-n$k
    [ -f "$STATE/$ns/slurmd.pid" ] && stop_pid "$(cat "$STATE/$ns/slurmd.pid")"
    if ip netns list 2>/dev/null | grep -qw "$ns"; then
      # slurmstepd and tasks outlive SIGTERM to slurmd: everything left inside goes
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
      ip netns del "$ns"
    fi
    rm -rf "/etc/netns/$ns"
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
  [ -f "$STATE/slurmctld.pid" ] && stop_pid "$(cat "$STATE/slurmctld.pid")"
  if [ -f "$STATE/munged.pid" ]; then stop_pid "$(cat "$STATE/munged.pid")"; else
    for pid in $(pgrep -x munged); do stop_pid "$pid"; done; fi
  rm -f "$STATE/nodes" "$STATE/munged.pid"
  echo "slurm stopped"
}

kill_node() { local pid; for pid in $(ip netns pids "dapple-n$1" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done; }

cut_link() { ip -n "dapple-n$1" link set eth0 down; }

heal_node() {
  local ns=dapple-n$1
  ip -n "$ns" link set eth0 up
  running "$ns/slurmd" || ip netns exec "$ns" unshare --uts sh -c "hostname $ns && exec slurmd -N $ns"
  for _ in $(seq 60); do
    scontrol update nodename="$ns" state=resume >/dev/null 2>&1 || true
    sinfo -h -N -n "$ns" -o '%T' | grep -qE '^(idle|mixed|allocated)$' && { echo "$ns is back"; return; }
    sleep 1
  done
  echo "$ns did not come back: $(sinfo -h -N -n "$ns" -o '%T')"; exit 1
}

case "${1:-}" in
  start) shift; start "$@" ;;
  kill-node) kill_node "$2" ;;
  cut-link) cut_link "$2" ;;
  heal-node) heal_node "$2" ;;
  stop) stop ;;
  status) sinfo && squeue ;;
  *) echo "usage: $0 start [--nodes N] [--cpus-per-node C] | stop | status | kill-node K | cut-link K | heal-node K"
     exit 2 ;;
esac
