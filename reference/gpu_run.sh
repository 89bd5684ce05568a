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
# results/jagielski/trained/ and a rerun trains only the rest, so a command cut off at
# BUDGET loses at most one block per job. Made for machines lent for a few minutes a
# command, which start bare and give back only OUT: if .carry/ holds the kept.tgz.* parts
# of an earlier command and results/jagielski/trained/ is absent, they are unpacked first.
#
# Leaves in OUT: kept.tgz.NN (the kept blocks, in parts of at most 15 MiB), scores.tgz.NN
# (the score tables of every finished job), small.tgz (logs, tables, figures) and
# snakemake.log.
set -uo pipefail
budget=${1:?usage: gpu_run.sh BUDGET TARGET... [-- SNAKEMAKE_ARGS...]}
shift
OUT=${OUT:-results/gpu_out}
mkdir -p "$OUT"
targets=() extra=()
while (($#)); do
  if [[ $1 == -- ]]; then shift; extra=("$@"); break; fi
  targets+=("$1"); shift
done
((${#targets[@]})) || { echo "gpu_run.sh: name at least one target" >&2; exit 2; }

start=$SECONDS
if [[ ! -d results/jagielski/trained ]] && compgen -G ".carry/kept.tgz.*" >/dev/null; then
  cat .carry/kept.tgz.* | tar -xzf - && echo "gpu_run.sh: unpacked the kept blocks in .carry"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

# Targets before --configfile, which takes several values. --nolock: a command cut off
# at its limit can leave a lock behind; the machine runs one workflow at a time.
PYTHONUNBUFFERED=1 timeout --kill-after=20 "$budget" \
  snakemake "${targets[@]}" "${extra[@]}" --cores all --scheduler greedy --nolock \
  --rerun-incomplete --configfile ${CONFIGS:-config/config.yaml} \
  > >(tee "$OUT/snakemake.log") 2>&1
rc=$?
echo "gpu_run.sh: snakemake exit $rc after $((SECONDS - start)) s" \
  "(124: stopped at the budget; the next command goes on from the kept blocks)"

pack() {  # pack NAME PATH...: a gzipped tar in parts of 15 MiB, if any PATH exists
  local name=$1 have=()
  shift
  for p in "$@"; do [[ -e $p ]] && have+=("$p"); done
  ((${#have[@]})) && tar -czf - "${have[@]}" | split -b 15M -d - "$OUT/$name.tgz."
}
pack kept results/jagielski/trained
pack scores results/jagielski/scores
tar -czf "$OUT/small.tgz" --ignore-failed-read logs results/*.csv results/*.md \
  results/*.html figures 2>/dev/null
ls -l "$OUT"
exit "$rc"
