#!/usr/bin/env bash
# One command of the reference run on a GPU machine (reference/README.md): the workflow's
# jobs for TARGET... for at most BUDGET seconds, then what a later command, or the audits
# on a CPU, need, packed into the folder OUT (default results/gpu_out).
#
#   [CONFIGS="config/config.yaml offline.yaml"] bash reference/gpu_run.sh BUDGET TARGET... \
#       [-- SNAKEMAKE_ARGS...]
#
# Runs in the checkout's root with snakemake and `dpaudit` on PATH; CONFIGS (default
# config/config.yaml) are the --configfile files, e.g. with an overlay that says where the
# data are (docs/data.md). Each finished block of trials is kept in
# results/jagielski/trained/ (Tramer et al.'s batches of runs in results/tramer/trained/)
# and a rerun trains only the rest, so a command cut off at BUDGET loses at most one call
# per job. BUDGET covers snakemake only: leave a minute of a
# command's limit for unpacking, stopping the jobs (up to 20 s) and packing.
#
# Made for machines lent minutes at a time, which start bare and give back only OUT: copy
# the kept.tgz.* parts of the last command into RESTORE (default .carry/) and send that
# folder with the next command; if neither kept folder is there, they are unpacked
# first. Kept blocks count only on the same GPU model, torch and trainer code (docs/scale.md),
# so keep to one kind of GPU. Task files are rebuilt (CIFAR-10's pretraining is bitwise
# reproducible on the same GPU model).
#
# Leaves in OUT (replacing what an earlier command left there): kept.tgz.NN (the kept
# blocks, in parts of at most 15 MiB), scores.tgz.NN (the score tables of every job
# finished on this machine), small.tgz (logs, tables, figures) and snakemake.log.
set -uo pipefail
usage="usage: gpu_run.sh BUDGET TARGET... [-- SNAKEMAKE_ARGS...]"
budget=${1:?$usage}
shift
[[ $budget =~ ^[1-9][0-9]*$ ]] || { echo "gpu_run.sh: BUDGET=$budget: seconds > 0; $usage" >&2; exit 2; }
RESTORE=${RESTORE:-.carry}
OUT=${OUT:-results/gpu_out}
mkdir -p "$OUT"
targets=() extra=()
while (($#)); do
  if [[ $1 == -- ]]; then shift; extra=("$@"); break; fi
  targets+=("$1"); shift
done
((${#targets[@]})) || { echo "gpu_run.sh: name at least one target; $usage" >&2; exit 2; }

start=$SECONDS
if [[ ! -d results/jagielski/trained && ! -d results/tramer/trained ]] \
    && compgen -G "$RESTORE/kept.tgz.*" >/dev/null; then
  cat "$RESTORE"/kept.tgz.* | tar -xzf - && echo "gpu_run.sh: unpacked the kept blocks in $RESTORE"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

# Targets before --configfile, which takes several values. --nolock: a command cut off
# at its limit can leave a lock behind; the machine runs one workflow at a time.
PYTHONUNBUFFERED=1 timeout --kill-after=20 "$budget" \
  snakemake "${targets[@]}" "${extra[@]}" --cores all --scheduler greedy --nolock \
  --rerun-incomplete --configfile ${CONFIGS:-config/config.yaml} 2>&1 | tee "$OUT/snakemake.log"
rc=${PIPESTATUS[0]}
echo "gpu_run.sh: snakemake exit $rc after $((SECONDS - start)) s"
if ((rc == 124 || rc == 137)); then
  echo "gpu_run.sh: stopped at the budget; run the same command again to go on from the kept blocks"
fi

pack() {  # pack NAME PATH...: a gzipped tar in parts of 15 MiB, if any PATH exists
  local name=$1 have=()
  shift
  rm -f "$OUT/$name".tgz.*
  for p in "$@"; do [[ -e $p ]] && have+=("$p"); done
  ((${#have[@]})) && tar -czf - "${have[@]}" | split -b 15M -d - "$OUT/$name.tgz."
}
pack kept results/jagielski/trained results/tramer/trained
pack scores results/jagielski/scores
tar -czf "$OUT/small.tgz" --ignore-failed-read logs results/*.csv results/*.md \
  results/*.html figures 2>/dev/null
ls -l "$OUT"
exit "$rc"
