#!/usr/bin/env bash
# A one-node Slurm cluster on this machine (localhost, no accounting): munged, slurmctld and slurmd,
# with the node's real CPUs and memory (`slurmd -C`). For tests/cli/test_slurm_cluster.py and for trying
# the Slurm launchers (docs/scale-out.md) without a cluster. Needs root and Debian's packages:
#   apt-get install -y slurm-wlm munge      # Debian 12: Slurm 22.05
# Stop it with .ci/slurm-down.sh. Refuses to replace a slurm.conf it did not write.
set -euo pipefail
conf_dir=/etc/slurm
conf="$conf_dir/slurm.conf"
marker="# written by rstitch .ci/slurm-up.sh"
if [ "$(id -u)" != 0 ]; then echo "slurm-up: needs root (it starts munged, slurmctld and slurmd)" >&2; exit 2; fi
for cmd in munged slurmctld slurmd sbatch; do
    command -v "$cmd" >/dev/null || { echo "slurm-up: no $cmd: apt-get install -y slurm-wlm munge" >&2; exit 2; }
done
if [ -f "$conf" ] && ! grep -qF "$marker" "$conf"; then
    echo "slurm-up: $conf exists and was not written here; leaving this machine's Slurm alone" >&2; exit 2
fi

# The node as slurmd sees it, less a little memory for the daemons.
node="$(slurmd -C | head -1)"
cpus="$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node")"
memory="$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$node")"
memory=$((memory * 9 / 10))
layout="$(grep -o 'Boards=[0-9]* SocketsPerBoard=[0-9]* CoresPerSocket=[0-9]* ThreadsPerCore=[0-9]*' <<<"$node")"

mkdir -p "$conf_dir" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
cat >"$conf" <<CONF
$marker
ClusterName=rstitch-ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
KillWait=10
SchedulerParameters=batch_sched_delay=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus $layout RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF

chown munge:munge /run/munge
if ! pgrep -x munged >/dev/null; then
    runuser -u munge -- /usr/sbin/munged
fi
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd -N localhost
# Ready when the node is idle (it starts as unknown, then registers).
for _ in $(seq 60); do
    state="$(sinfo -h -n localhost -o %t 2>/dev/null || true)"
    case "$state" in idle*|mix*|alloc*) echo "slurm-up: localhost $state, $cpus CPUs, ${memory} MB"; exit 0 ;; esac
    sleep 1
done
echo "slurm-up: the node did not come up (state '${state:-none}'); see /var/log/slurm/" >&2
exit 1
