#!/bin/sh
# slurm-single-node.sh — `kvsim sweep --emit slurm` end to end on a real single-node Slurm started here:
# munged, slurmctld and slurmd with a generated slurm.conf in a temporary folder (nothing outside it is
# touched; every daemon is stopped by its pid at the end), the emitted sweep.slurm submitted with
# `sbatch --wait`, then `kvsim sweep --collect`, whose sweep.csv must equal `kvsim sweep`'s own.
# Usage: slurm-single-node.sh KVSIM SWEEP.yaml. Exit 0: equal; 1: a failure; 77: Slurm cannot start
# here, after one line "skipped: slurm cannot start here: <reason>" (tests/cli/test_emit_cluster.c).
set -u
kvsim=$1
sweep=$2
skip() { echo "skipped: slurm cannot start here: $*"; exit 77; }
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done; exit 1; }
for c in munged slurmctld slurmd sbatch sinfo; do
    command -v "$c" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$c" >/dev/null 2>&1 ||
        skip "no $c (Debian: apt-get install --no-install-recommends slurmctld slurmd slurm-client munge)"
done
PATH=$PATH:/usr/sbin
[ "$(id -u)" = 0 ] || skip "slurmd must run as root to start jobs (running as uid $(id -u))"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvsim-slurm.XXXXXX") || exit 1
pids=""
cleanup() {
    for p in $pids; do kill "$p" 2>/dev/null; done
    for p in $pids; do
        n=0
        while kill -0 "$p" 2>/dev/null && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
        kill -9 "$p" 2>/dev/null
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# munge: a fresh key and socket of our own.
dd if=/dev/urandom of="$tmp/munge.key" bs=1024 count=1 2>/dev/null && chmod 600 "$tmp/munge.key"
mkdir -m 755 "$tmp/munge"
munged --foreground --force --key-file="$tmp/munge.key" --socket="$tmp/munge/sock" \
    --pid-file="$tmp/munged.pid" --seed-file="$tmp/munge.seed" --log-file="$tmp/munged.log" 2> "$tmp/munged.out.log" &
pids="$pids $!"
n=0
while [ ! -S "$tmp/munge/sock" ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
[ -S "$tmp/munge/sock" ] || skip "munged did not start: $(tail -n 2 "$tmp/munged.log" 2>/dev/null | tr '\n' ' ')"

host=$(hostname -s)
cpus=$(nproc)
port=$((20000 + $$ % 20000))
mkdir -p "$tmp/state" "$tmp/spool"
cat > "$tmp/slurm.conf" <<CONF
ClusterName=kvsimtest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/sock
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=kvsim Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$tmp/slurm.conf"
slurmctld -D -i -f "$SLURM_CONF" > "$tmp/slurmctld.out.log" 2>&1 &
pids="$pids $!"
slurmd -D -f "$SLURM_CONF" > "$tmp/slurmd.out.log" 2>&1 &
pids="$pids $!"
n=0
state=""
while [ $n -lt 300 ]; do
    state=$(sinfo -h -o %T 2>/dev/null | head -n 1)
    [ "$state" = idle ] && break
    sleep 0.1
    n=$((n + 1))
done
[ "$state" = idle ] || skip "the node is not idle after 30 s (state '$state'): $(tail -n 3 "$tmp/slurmd.log" "$tmp/slurmctld.log" 2>/dev/null | tr '\n' ' ')"

# The sweep two ways: kvsim sweep itself, and the emitted job array under Slurm.
"$kvsim" sweep "$sweep" -j 2 --out "$tmp/local" > "$tmp/local.log" 2>&1 || fail "kvsim sweep: $(cat "$tmp/local.log")"
"$kvsim" sweep "$sweep" --emit slurm --out "$tmp/slurm" > "$tmp/emit.log" 2>&1 || fail "--emit slurm: $(cat "$tmp/emit.log")"
(cd "$tmp" && timeout 300 sbatch --wait "$tmp/slurm/sweep.slurm") > "$tmp/sbatch.log" 2>&1 ||
    fail "sbatch --wait: $(cat "$tmp/sbatch.log")"
"$kvsim" sweep --collect "$tmp/slurm" > "$tmp/collect.log" 2>&1 || fail "--collect: $(cat "$tmp/collect.log")"
cmp "$tmp/local/sweep.csv" "$tmp/slurm/sweep.csv" > /dev/null ||
    fail "sweep.csv differs: $(diff "$tmp/local/sweep.csv" "$tmp/slurm/sweep.csv" | head -n 10)"
echo "slurm: $(grep -c ',ok,' "$tmp/slurm/sweep.csv") rows ok, sweep.csv equal to kvsim sweep's"
exit 0
