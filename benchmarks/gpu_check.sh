#!/usr/bin/env bash
# gpu_check.sh: what a GPU session should measure, in ONE command of at most 9 minutes on
# a GPU machine lent for minutes (docs/scale.md, "Machines lent for minutes at a time"),
# and a --dry-run of the same stages on a CPU at tiny scale (tests/test_gpu_check.py).
#
#   bash benchmarks/gpu_check.sh OUTDIR [--budget SECONDS] [--dry-run] [--stages LIST] [--plan]
#
# THE GPU RUN. Here, first `bash ../shared/gpu/prepare-carry.sh` (wheels of snakemake,
# dp-accounting, jsonschema and what they need in .whl/, Fashion-MNIST in .data/). Then
# the device tool's `run` with carry [".whl", ".data"], timeout_s 600 and this command (one
# line: the prefix prepare-carry.sh prints, then this script):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH DPAUDIT_DATA=$PWD/.data && printf '#!/bin/sh\nexec python3 -c "import sys; from dpaudit.cli import main; sys.exit(main())" "$@"\n' >/tmp/site/bin/dpaudit && chmod +x /tmp/site/bin/dpaudit && printf 'data:\n  root: %s/.data\n  download: false\n' "$PWD" >/tmp/offline.yaml && { python3 -m pip check | grep -v '^No broken' || true; } && bash benchmarks/gpu_check.sh "$OUT"
#
# The prefix takes well under a minute, the default budget of 520 s the rest of the 600 s;
# the tool brings OUTDIR's files back. numba is not carried (its LLVM alone is larger than
# the carry allows): there the CPU's draws (the tests' CPU references) run as torch
# operations, the same bits more slowly, with a warning (dpaudit.dpsgd.philox). There is no MNIST there and no CIFAR-10: in stage
# 6 the jobs that need them (Abadi et al.'s Figure 3, the CIFAR-10 jobs) fail, the rest
# goes on (--keep-going).
# `prepare-carry.sh --cifar --no-pulp` adds the CIFAR-10 tarball (and prints the prefix
# whose overlay names it), but the checkout (2.8 MiB now), .whl/ (10 MiB without PuLP)
# and .data/ (48 MiB) then need LIMIT_MIB=63, within the tool's 64 MiB. The same command
# again on the same (warm) machine goes on from the kept blocks of trials and runs
# (results/*/trained/ stay in the checkout; `--stages tight,all` skips what is done); a
# fresh machine starts over (reference/gpu_run.sh packs kept blocks for the next one).
#
# STAGES, in this order, each timed; each may take its share of the budget left when it
# starts (SHARE, at least FLOOR, never more than is left; `timeout`); a stage that fails
# or runs out of time is recorded and the next one runs:
#   env          nvidia-smi (name, memory, driver), torch and CUDA versions; starts the
#                sampler `nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used
#                --format=csv -l 1` (stopped at the end: peak utilisation and memory,
#                overall and per stage)
#   cuda_tests   python3 -m pytest tests/test_cuda.py -q
#   bench_dpsgd  python3 benchmarks/bench_dpsgd.py --cuda-only --skip-levers (the groups'
#                speeds and the projection)
#   bench_step   python3 benchmarks/bench_step.py --device cuda (Tramer et al.'s runs, the
#                black box's, the white box's per second, beside .base/src if carried)
#   tramer       snakemake results/tramer_audit.csv: Tramer et al.'s paper-scale audit
#                alone (config/config.yaml + the offline data overlay)
#   tight        snakemake results/tight/whitebox.csv results/tight/blackbox.csv: the
#                tight audits' full tables, both models x every eps label, at 10,000 runs
#                per side (+ config/gpu_check_tight.yaml)
#   all          snakemake (the default target: every figure) for what is left of the
#                budget, counting finished against total jobs
# Snakemake runs with --cores all --keep-going --rerun-incomplete --nolock --scheduler
# greedy, in the checkout.
#
# OUTDIR (flat, 5 files, each replaced; the device tool brings back 8 files of <= 16 MiB):
#   summary.txt      the final table (also printed last: the caller sees the end)
#   timings.tsv      stage, seconds, exit, status, limit_s, peak_util_pct, peak_mem_mib, note
#   stages.log       every stage's command and output, one after the other (<= 2 MiB each)
#   gpu_samples.csv  the nvidia-smi samples (a header only where there is no nvidia-smi)
#   results.tar.gz   results/ tables, figures/ and the jobs' logs/ (<= 15 MiB: else the
#                    tables alone, without per-run losses)
# Status of a stage: ok; FAILED (its exit status); TIMEOUT (stopped at its limit); NO-TIME
# (too little budget left to start it); skip (not in --stages, or its script is absent);
# `all` cut at the budget is "budget" (as planned). Exit status 0 when every stage is ok,
# skip or that (`all` may also be NO-TIME); 1 otherwise; 2 for a usage error. Stopped by
# SIGTERM or SIGINT, it ends the running stage (INTERRUPTED; the rest NOT-RUN), writes the
# files and the table, and exits 130.
#
# --dry-run: the same stages on the CPU (CUDA_VISIBLE_DEVICES=""), at tiny scale:
# config/quick.yaml + config/gpu_check_dry.yaml on tiny real-format data written to a
# temporary folder (tests/fakedata.py), snakemake in a temporary working directory (both
# removed at the end) with --cores 2 (the tight stage --max-threads 1: its two audits side
# by side); no nvidia-smi (noted, no failure); bench_dpsgd.py --cuda-only --tiny and
# bench_step.py --device cuda --tiny --threads 1. DPAUDIT_FORCE_GPU is set to an H100's
# description, so that the GPU-only branches run on the CPU, with TORCHDYNAMO_DISABLE=1 (unless set):
# compiling the forced GPU's fused draws cost tramer 84 s and tight 57 s with a cold
# cache. `all` stops after 12 s, as it would at the budget. Alone on 2 idle cores the dry
# run took 101 s (env 3, cuda_tests 7, bench_dpsgd 20, bench_step 12, tramer 26, tight 22,
# all 11), beside the test suite 170 s. The budget, 400 s, is room for a loaded machine:
# the stages end when they are done. A stage stubbed by GPU_CHECK_FAIL logs the command it
# stands in for.
#
# --stages LIST   comma-separated stages to run (default: all seven; the others: skip)
# --plan          print each stage's command and limit, run none (the files are written)
# Environment: PYTHON (default python3); GPU_CHECK_OFFLINE (the data overlay: default
# /tmp/offline.yaml, else one made here for .data/); GPU_CHECK_WORKDIR (snakemake's working
# directory: default the checkout, a temporary folder in a dry run); GPU_CHECK_SHARES
# ("tramer=0.6,tight=0.8": shares of the budget left); GPU_CHECK_FAIL (a test hook:
# "STAGE[=CODE|=hang],...": that stage's command exits CODE, default 3, or sleeps until
# its limit); GPU_CHECK_KEEP_TMP=1 keeps the temporary folder.
set -uo pipefail
export PYTHONUNBUFFERED=1

STAGES=(env cuda_tests bench_dpsgd bench_step tramer tight all)
usage="usage: bash benchmarks/gpu_check.sh OUTDIR [--budget SECONDS] [--dry-run] [--stages LIST] [--plan]"
die_usage() { echo "gpu_check.sh: $*" >&2; echo "$usage" >&2; exit 2; }

OUTDIR="" BUDGET="" DRY=0 PLAN=0 SELECT=""
while (($#)); do
  case $1 in
    --budget) (($# >= 2)) || die_usage "--budget needs a number of seconds"; BUDGET=$2; shift ;;
    --budget=*) BUDGET=${1#--budget=} ;;
    --dry-run) DRY=1 ;;
    --plan) PLAN=1 ;;
    --stages) (($# >= 2)) || die_usage "--stages needs a list"; SELECT=$2; shift ;;
    --stages=*) SELECT=${1#--stages=} ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die_usage "unknown option $1" ;;
    *) [[ -z $OUTDIR ]] || die_usage "one OUTDIR only (got $OUTDIR and $1)"; OUTDIR=$1 ;;
  esac
  shift
done
[[ -n $OUTDIR ]] || die_usage "name the output folder"
BUDGET=${BUDGET:-$((DRY ? 400 : 520))}
[[ $BUDGET =~ ^[1-9][0-9]*$ ]] || die_usage "--budget $BUDGET: a whole number of seconds > 0"
declare -A WANT=()
IFS=, read -ra picked <<<"${SELECT:-$(IFS=,; echo "${STAGES[*]}")}"
for s in "${picked[@]}"; do
  [[ " ${STAGES[*]} " == *" $s "* ]] || die_usage "--stages: no stage '$s' (stages: ${STAGES[*]})"
  WANT[$s]=1
done

now() { local t=${EPOCHREALTIME:-}; if [[ -n $t ]]; then echo "${t/,/.}"; else date +%s.%N; fi; }
T0=$(now)
elapsed() { awk -v a="$T0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
mkdir -p "$OUTDIR" || die_usage "cannot create $OUTDIR"
OUT=$(cd "$OUTDIR" && pwd)
FILES=(summary.txt timings.tsv stages.log gpu_samples.csv results.tar.gz)
for f in "${FILES[@]}"; do rm -f "${OUT:?}/$f"; done
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
mkdir -p "$TMP/logs"
PY=${PYTHON:-python3}

# RESERVE: seconds kept for packing and the table; GRACE: `timeout --kill-after`; a stage
# whose limit would be under MIN_LIMIT is not started; ENV_LIMIT: the env stage's limit;
# ALL_CAP (dry run): `all` only shows that it runs, is cut and counted (the tiny DAG takes
# minutes on 2 cores).
declare -A SHARE=([cuda_tests]=0.2 [bench_dpsgd]=0.25 [bench_step]=0.15 [tramer]=0.5
                  [tight]=0.7 [all]=1)
if ((DRY)); then
  RESERVE=4 GRACE=3 MIN_LIMIT=3 ENV_LIMIT=24 ALL_CAP=12
  declare -A FLOOR=([cuda_tests]=20 [bench_dpsgd]=30 [bench_step]=40 [tramer]=60 [tight]=70)
  export CUDA_VISIBLE_DEVICES=""
  WORKDIR=${GPU_CHECK_WORKDIR:-$TMP/work}
  CORES=(--cores 2)
  TIGHT_EXTRA=(--max-threads 1)  # its two audits side by side, a thread each
  # torch.compile of the forced GPU's fused draws costs each process tens of seconds on 2
  # cores (a cold cache); uncompiled they are the same operations (set it to 0 to compile).
  export TORCHDYNAMO_DISABLE=${TORCHDYNAMO_DISABLE:-1}
  export DPAUDIT_FORCE_GPU='{"name": "NVIDIA H100 80GB HBM3", "total_memory": 85899345920, "free_memory": 84000000000, "capability": "9.0", "sm_count": 132}'
else
  RESERVE=10 GRACE=15 MIN_LIMIT=10 ENV_LIMIT=30 ALL_CAP=0
  declare -A FLOOR=([cuda_tests]=90 [bench_dpsgd]=60 [bench_step]=30 [tramer]=120 [tight]=60)
  WORKDIR=${GPU_CHECK_WORKDIR:-$ROOT}
  CORES=(--cores all)
  TIGHT_EXTRA=()
fi
mkdir -p "$WORKDIR"
if [[ -n ${GPU_CHECK_SHARES:-} ]]; then
  IFS=, read -ra pairs <<<"$GPU_CHECK_SHARES"
  for p in "${pairs[@]}"; do SHARE[${p%%=*}]=${p#*=}; done
fi
declare -A FAIL=()
if [[ -n ${GPU_CHECK_FAIL:-} ]]; then
  IFS=, read -ra pairs <<<"$GPU_CHECK_FAIL"
  for p in "${pairs[@]}"; do
    if [[ $p == *=* ]]; then FAIL[${p%%=*}]=${p#*=}; else FAIL[$p]=3; fi
  done
fi

# ------------------------------------------------------------------ recording
SAMPLER="" CURRENT="" CURRENT_PID="" CURRENT_T0=""
ROWS=()  # stage, seconds, exit, status, limit, peak util, peak MiB, note (tab-separated)
declare -A RECORDED=()
printf 'stage\tseconds\texit\tstatus\tlimit_s\tpeak_util_pct\tpeak_mem_mib\tnote\n' >"$OUT/timings.tsv"

samples() { if [[ -f $OUT/gpu_samples.csv ]]; then wc -l <"$OUT/gpu_samples.csv"; else echo 0; fi; }
peaks() {  # peaks FIRST LAST: "util<TAB>MiB", the largest in sample lines FIRST..LAST
  awk -F', *' -v a="$1" -v b="$2" 'NR >= a && NR <= b && $2 ~ /^[0-9]+ *%/ {
      u = $2 + 0; m = $3 + 0; n++; if (u > pu) pu = u; if (m > pm) pm = m }
    END { if (n) printf "%d\t%d", pu, pm; else printf "-\t-" }' "$OUT/gpu_samples.csv" 2>/dev/null
}
record() {  # record STAGE SECONDS EXIT STATUS LIMIT UTIL MIB NOTE
  local row
  row=$(printf '%s\t' "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$(printf '%s' "$8" | tr '\t\n' '  ')")
  ROWS+=("${row%$'\t'}")
  RECORDED[$1]=1
  printf '%s\n' "${row%$'\t'}" >>"$OUT/timings.tsv"
}
append_log() {  # append_log LOGFILE HEADER: into stages.log, at most 2 MiB of it
  local size
  size=$(stat -c %s "$1" 2>/dev/null || echo 0)
  {
    printf '\n===== %s =====\n' "$2"
    if ((size > 2 * 1048576)); then
      head -c 524288 "$1"
      printf '\n[... gpu_check.sh: %d bytes left out ...]\n' $((size - 2 * 1048576))
      tail -c 1572864 "$1"
    else
      cat "$1"
    fi
  } >>"$OUT/stages.log" 2>/dev/null
}
is_snakemake() { [[ $1 == tramer || $1 == tight || $1 == all ]]; }
note_of() {  # a stage's one-line result, from its log
  local stage=$1 log=$2 ndone total failed stopped
  case $stage in
    env)
      { grep -m1 '^gpu: ' "$log" | cut -c6- | cut -d, -f1-2 || echo "no nvidia-smi"
        grep -m1 '^torch [0-9]' "$log" | cut -d, -f1-2; } | paste -sd';' | sed 's/;/; /' ;;
    cuda_tests)
      grep -E '[0-9]+ (passed|failed|skipped|errors?)' "$log" | tail -n 1 | tr -d '=' \
        | sed 's/^ *//' ;;
    bench_dpsgd)
      grep -E '^(Projection|table2 grid)' "$log" | tail -n 1 | cut -c1-110 ;;
    tramer|tight|all)
      if grep -q "Nothing to be done" "$log"; then echo "nothing to be done: all up to date"; return; fi
      read -r ndone total < <(grep -oE '^[0-9]+ of [0-9]+ steps' "$log" | tail -n 1 | awk '{print $1, $3}')
      [[ -n ${total:-} ]] || total=$(awk '/^Job stats:/ {s = 1} s && $1 == "total" {print $2; exit}' "$log")
      # jobs ended by the stage's limit are "stopped", not failed
      stopped=$(grep -cE 'died with <Signals.SIG(TERM|KILL)|non-zero exit status (143|137)\.' "$log")
      failed=$(($(grep -c '^Error in rule' "$log") - stopped))
      ((failed >= 0)) || failed=0
      echo "${ndone:-0} of ${total:-?} jobs done$( ((failed)) && echo ", $failed failed")$( ((stopped)) && echo ", $stopped stopped")" ;;
    *)
      grep -v '^[[:space:]]*$' "$log" | tail -n 1 | cut -c1-110 ;;
  esac
}
show_tail() {  # the end of a stage's log on stdout (the caller sees only the last 12 kB)
  local stage=$1 log=$2
  if is_snakemake "$stage"; then
    grep -E '^Error in rule|steps \([0-9]+%\) done|^Nothing to be done' "$log" | tail -n 6
  else
    case $stage in env) tail -n 14 "$log" ;; bench_dpsgd) tail -n 24 "$log" ;; *) tail -n 8 "$log" ;; esac
  fi | cut -c1-160 | sed 's/^/   /'
}

# run_stage STAGE COMMAND...: COMMAND under `timeout` (its own process group), its output
# in the stage's log; timed and recorded.
run_stage() {
  local stage=$1
  shift
  local left allowance limit log="$TMP/logs/$stage.log" t0 secs rc status first pk note
  if [[ -z ${WANT[$stage]:-} ]]; then
    record "$stage" 0 - skip - - - "not in --stages"
    return
  fi
  left=$(awk -v b="$BUDGET" -v r="$RESERVE" -v e="$(elapsed)" 'BEGIN {printf "%d", b - r - e}')
  if [[ $stage == env ]]; then
    allowance=$((ENV_LIMIT + GRACE))
  else
    allowance=$(awk -v l="$left" -v s="${SHARE[$stage]:-0.2}" -v f="${FLOOR[$stage]:-0}" \
      'BEGIN {a = l * s; if (a < f) a = f; printf "%d", a}')
  fi
  if [[ $stage == all ]] && ((ALL_CAP && allowance > ALL_CAP)); then allowance=$ALL_CAP; fi
  ((allowance <= left)) || allowance=$left
  limit=$((allowance - GRACE))
  local stubbed=""
  if [[ -n ${FAIL[$stage]:-} ]]; then
    stubbed=" [in place of: $*]"
    if [[ ${FAIL[$stage]} == hang ]]; then
      set -- "$PY" -c 'import sys, time; print("GPU_CHECK_FAIL: hangs", sys.argv[1]); time.sleep(86400)' "$OUT"
    else
      # shellcheck disable=SC2016  # $0 is bash -c's first argument
      set -- bash -c 'echo "GPU_CHECK_FAIL: exits $0"; exit "$0"' "${FAIL[$stage]}"
    fi
  fi
  if ((PLAN)); then
    printf '%s\n' "$*" >"$log"
    append_log "$log" "$stage (plan: limit $limit s)"
    echo "== gpu_check: $stage: limit $limit s: $*"
    record "$stage" 0 - plan "$limit" - - "not run (--plan)"
    return
  fi
  if ((limit < MIN_LIMIT)); then
    printf 'not started: %s s of the budget left\n' "$left" >"$log"
    append_log "$log" "$stage: not started"
    echo "== gpu_check: $stage: not started: $left s of the budget left"
    record "$stage" 0 - NO-TIME - - - "$left s of the budget left"
    return
  fi
  echo "== gpu_check: $stage: start at $(elapsed) s, limit $limit s: $(cut -c1-180 <<<"$*")"
  first=$(($(samples) + 1))
  t0=$(now)
  CURRENT=$stage CURRENT_T0=$t0
  timeout --kill-after="$GRACE" "$limit" "$@" >"$log" 2>&1 </dev/null &
  CURRENT_PID=$!
  wait "$CURRENT_PID"
  rc=$?
  kill -KILL -- -"$CURRENT_PID" 2>/dev/null  # what the stage left in its process group
  CURRENT="" CURRENT_PID=""
  secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')
  pk=$(peaks "$first" "$(samples)")
  # 124 / 137: `timeout` stopped it (TERM, then KILL) at its limit; 137 sooner: killed
  # by something else (the kernel's OOM killer)
  if [[ $rc == 0 ]]; then
    status=ok
  elif [[ $rc == 124 || $rc == 137 ]] && awk -v s="$secs" -v l="$limit" 'BEGIN {exit !(s >= l - 0.5)}'; then
    if [[ $stage == all ]]; then status=budget; else status=TIMEOUT; fi
  else
    status=FAILED
  fi
  note=$(note_of "$stage" "$log")
  [[ -z ${FAIL[$stage]:-} ]] || note="GPU_CHECK_FAIL=${FAIL[$stage]}; $note"
  append_log "$log" "$stage: $*$stubbed (limit $limit s): exit $rc ($status) after $secs s"
  show_tail "$stage" "$log"
  echo "== gpu_check: $stage: exit $rc ($status) after $secs s${note:+: $note}"
  record "$stage" "$secs" "$rc" "$status" "$limit" "${pk%%$'\t'*}" "${pk##*$'\t'}" "$note"
}
skip_stage() {  # skip_stage STAGE WHY
  printf '%s\n' "$2" >"$TMP/logs/$1.log"
  append_log "$TMP/logs/$1.log" "$1: skipped"
  echo "== gpu_check: $1: skipped: $2"
  record "$1" 0 - skip - - - "$2"
}

summary() {  # the final table, into summary.txt and printed last; returns 1 if a stage failed
  local pk gpu torch bad=0 r s secs rc status limit util mib note
  pk=$(peaks 2 999999999)
  gpu=$(grep -m1 '^gpu: ' "$TMP/logs/env.log" 2>/dev/null | cut -c6-)
  torch=$(grep -m1 '^torch [0-9]' "$TMP/logs/env.log" 2>/dev/null | cut -d, -f1-2)
  touch "$OUT/summary.txt"
  {
    echo
    echo "gpu_check.sh$( ((DRY)) && echo " --dry-run")$( ((PLAN)) && echo " --plan"): ${gpu:-no GPU}; ${torch:-torch ?}"
    echo "budget $BUDGET s, $(elapsed) s used; peak GPU utilisation ${pk%%$'\t'*} %, memory ${pk##*$'\t'} MiB; files in $OUT: $(cd "$OUT" && echo *)"
    printf '%-12s %7s %5s %-11s %6s %5s %6s  %s\n' stage seconds exit status limit util% MiB note
    for r in "${ROWS[@]}"; do
      IFS=$'\t' read -r s secs rc status limit util mib note <<<"$r"
      printf '%-12s %7s %5s %-11s %6s %5s %6s  %s\n' "$s" "$secs" "$rc" "$status" "$limit" \
        "$util" "$mib" "${note:0:80}"
      case $status in
        ok|skip|budget|plan) ;;
        NO-TIME) [[ $s == all ]] || bad=1 ;;
        *) bad=1 ;;
      esac
    done
  } >"$OUT/summary.txt"
  cat "$OUT/summary.txt"
  return $bad
}

pack_results() {  # results.tar.gz: tables, figures, the jobs' logs (the tables alone if > 15 MiB)
  (
    cd "$WORKDIR" || exit 1
    shopt -s nullglob
    pack() { tar -czf "$OUT/results.tar.gz" --ignore-failed-read -T /dev/null "$@" 2>/dev/null; }
    if ((PLAN)); then pack; exit 0; fi
    tables=(results/*.csv results/*.md results/tight/*.csv)
    small=()
    for f in "${tables[@]}"; do [[ $f == *_losses.csv ]] || small+=("$f"); done
    more=()
    for f in figures logs; do [[ -e $f ]] && more+=("$f"); done
    pack "${tables[@]}" "${more[@]}"
    if (($(stat -c %s "$OUT/results.tar.gz") > 15 * 1048576)); then
      echo "gpu_check.sh: results.tar.gz over 15 MiB: the tables alone, without per-run losses" >&2
      pack "${small[@]}"
    fi
  )
}

stop_sampler() {
  if [[ -n $SAMPLER ]]; then
    kill "$SAMPLER" 2>/dev/null
    wait "$SAMPLER" 2>/dev/null
    SAMPLER=""
  fi
}
cleanup() {
  stop_sampler
  [[ -n ${GPU_CHECK_KEEP_TMP:-} ]] || rm -rf "$TMP"
}
on_signal() {  # Ctrl-C, or a limit above the script's: end the stage, record it, print
  trap - INT TERM
  echo "gpu_check.sh: stopped by a signal during ${CURRENT:-no stage}" >&2
  if [[ -n $CURRENT_PID ]]; then
    kill -TERM "$CURRENT_PID" 2>/dev/null
    sleep 2
    kill -KILL -- -"$CURRENT_PID" 2>/dev/null
    append_log "$TMP/logs/$CURRENT.log" "$CURRENT: stopped by a signal"
    record "$CURRENT" "$(awk -v a="$CURRENT_T0" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')" \
      - INTERRUPTED - - - "stopped by a signal"
  fi
  for s in "${STAGES[@]}"; do
    [[ -n ${RECORDED[$s]:-} ]] || record "$s" 0 - NOT-RUN - - - "the script was stopped first"
  done
  stop_sampler
  pack_results
  summary
  cleanup
  exit 130
}
trap cleanup EXIT
trap on_signal INT TERM

# ------------------------------------------------------------------ preparation
SNAKE=("$PY" -m snakemake -s "$ROOT/Snakefile" --directory "$WORKDIR" "${CORES[@]}"
       --scheduler greedy --nolock --rerun-incomplete --keep-going)
prep_rc=0
if ((DRY)); then
  # Tiny Fashion-MNIST (IDX) and CIFAR-10 (ImageFolder of PNGs) in the real formats, as
  # the tests' run of the whole DAG writes them (tests/fakedata.py, tiny_image_data).
  ((PLAN)) || "$PY" - "$TMP/data" >"$TMP/logs/prep.log" 2>&1 <<'EOF' || prep_rc=$?
import sys
from pathlib import Path

sys.path.insert(0, "tests")
from fakedata import tiny_image_data

tiny_image_data(Path(sys.argv[1]))
print(f"tiny data in {sys.argv[1]}: Fashion-MNIST 120 + 40 images, CIFAR-10 18 per class")
EOF
  printf 'data:\n  root: %s\n  download: false\n' "$TMP/data" >"$TMP/data.yaml"
  C="$ROOT/config"
  BASE=("$C/config.yaml" "$C/quick.yaml" "$C/gpu_check_dry.yaml" "$TMP/data.yaml")
  # the GPU's tight overlay too, under the dry run's sizes (so both files are checked)
  TIGHT_CONF=("$C/config.yaml" "$C/quick.yaml" "$C/gpu_check_tight.yaml" "$C/gpu_check_dry.yaml"
              "$TMP/data.yaml")
else
  OFFLINE=${GPU_CHECK_OFFLINE:-/tmp/offline.yaml}
  if [[ ! -f $OFFLINE ]]; then
    OFFLINE=$TMP/offline.yaml
    if [[ -d .data ]]; then
      printf 'data:\n  root: %s/.data\n  download: false\n' "$ROOT" >"$OFFLINE"
      [[ ! -f .data/cifar10-jpeg.tar.gz ]] \
        || printf '  cifar10_tarball: %s/.data/cifar10-jpeg.tar.gz\n' "$ROOT" >>"$OFFLINE"
    else
      printf '{}\n' >"$OFFLINE"  # no data carried: the data jobs download (needs internet)
    fi
  fi
  { echo "data overlay $OFFLINE:"; cat "$OFFLINE"; } >"$TMP/logs/prep.log"
  BASE=("$ROOT/config/config.yaml" "$OFFLINE")
  TIGHT_CONF=("$ROOT/config/config.yaml" "$OFFLINE" "$ROOT/config/gpu_check_tight.yaml")
fi
{
  echo "gpu_check.sh$( ((DRY)) && echo " --dry-run") budget $BUDGET s, started $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "checkout $ROOT; snakemake's working directory $WORKDIR; python $PY"
  echo "DPAUDIT_FORCE_GPU=${DPAUDIT_FORCE_GPU:-} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-(unset)} TORCHDYNAMO_DISABLE=${TORCHDYNAMO_DISABLE:-}"
  cat "$TMP/logs/prep.log" 2>/dev/null
} >"$TMP/logs/prep.all"
append_log "$TMP/logs/prep.all" "preparation: exit $prep_rc after $(elapsed) s"
((prep_rc == 0)) || echo "gpu_check.sh: preparing the tiny data failed (exit $prep_rc): stages.log" >&2

# ------------------------------------------------------------------ 1. environment
cat >"$TMP/env.sh" <<'EOF'
PY=$1
echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); host $(hostname); $(nproc) cores$(free -g 2>/dev/null | awk '/^Mem:/ {print ", " $2 " GiB memory"}')"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo "(not a git checkout)")"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/gpu: /'
  nvidia-smi
else
  echo "nvidia-smi: not found (no NVIDIA driver here)"
fi
exec "$PY" - <<'PYEOF'
import os
import sys
from importlib.metadata import PackageNotFoundError, version

import torch

for name in ("snakemake", "dp-accounting", "jsonschema", "numpy", "scipy", "pandas"):
    try:
        print(f"{name} {version(name)}")
    except PackageNotFoundError:
        print(f"{name}: not installed")
print(f"torch sees {torch.cuda.device_count()} CUDA device(s)")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  cuda:{i} {p.name}, {p.total_memory / 2**30:.1f} GiB, capability "
          f"{p.major}.{p.minor}, {p.multi_processor_count} SMs")
if os.environ.get("DPAUDIT_FORCE_GPU"):
    print("DPAUDIT_FORCE_GPU:", os.environ["DPAUDIT_FORCE_GPU"])
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
      f"{torch.backends.cudnn.version()}, python {sys.version.split()[0]}")
PYEOF
EOF
if ((!DRY && !PLAN)) && command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 1 \
    >"$OUT/gpu_samples.csv" 2>&1 </dev/null &
  SAMPLER=$!
else
  echo "timestamp, utilization.gpu [%], memory.used [MiB]" >"$OUT/gpu_samples.csv"
fi
run_stage env bash "$TMP/env.sh" "$PY"

# ------------------------------------------------------------------ 2. CUDA tests
run_stage cuda_tests "$PY" -m pytest tests/test_cuda.py -q -p no:cacheprovider

# ------------------------------------------------------------------ 3. benchmarks
# On the GPU: the groups' speeds and projections (the levers take minutes), and the runs/s
# of the audits that need many runs beside the checkout in .base/src (the version before,
# if carried: `git worktree add` it and copy its src/ there); in the dry run, under
# DPAUDIT_FORCE_GPU, every line at tiny scale.
if ((!DRY)); then
  bench_args=(--cuda-only --skip-levers)
  step_args=(--device cuda --workloads tramer blackbox whitebox --repeats 1 --no-ops)
  [[ -d .base/src/dpaudit ]] && step_args+=(--baseline .base/src)
else
  bench_args=(--cuda-only --tiny)
  # one thread (its workers set their own): two OpenMP threads on a loaded 2-core machine
  # took 5x as long
  step_args=(--device cuda --tiny --threads 1)
fi
run_stage bench_dpsgd "$PY" benchmarks/bench_dpsgd.py "${bench_args[@]}"
run_stage bench_step "$PY" benchmarks/bench_step.py "${step_args[@]}"

# ------------------------------------------------------------------ 4. Tramer et al.
run_stage tramer "${SNAKE[@]}" results/tramer_audit.csv --configfile "${BASE[@]}"

# ------------------------------------------------------------------ 5. the tight tables
run_stage tight "${SNAKE[@]}" "${TIGHT_EXTRA[@]}" results/tight/whitebox.csv \
  results/tight/blackbox.csv --configfile "${TIGHT_CONF[@]}"

# ------------------------------------------------------------------ 6. the whole DAG
run_stage all "${SNAKE[@]}" --configfile "${BASE[@]}"

# ------------------------------------------------------------------ results, the table
stop_sampler
pack_results
summary
