#!/usr/bin/env bash
# Stops what .ci/slurm-up.sh started: every job, then slurmd, slurmctld and munged (by their pid files).
set -uo pipefail
scancel --user="$(id -un)" 2>/dev/null || true
for pid_file in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do
    [ -f "$pid_file" ] && kill "$(cat "$pid_file")" 2>/dev/null
done
for _ in $(seq 20); do
    pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || break
    sleep 0.5
done
echo "slurm-down: stopped"
