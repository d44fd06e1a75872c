#!/usr/bin/env bash
# GPU checks, for when a GPU machine is lent: one script, under 6 minutes on one GPU, one exit
# code (0: every check passed; 100: a prerequisite is missing, named; else the number of
# checks that failed, named on the last line).
#   bash benchmarks/gpu_check.sh            (from the repository root; writes $OUT or ./gpu-out)
#   bash benchmarks/gpu_check.sh --dry-run  (no GPU: every check but the CUDA-only ones end to
#                                           end on CPU slots, NVML faked; CI runs it)
# It uses the repository's venv where its PyTorch sees the GPU, else the machine's python3
# (a lent machine reaches no package index); Lightning, pytorch_lightning and transformers
# are there too. Each check prints what it measured and passes or fails on its criterion
# (benchmarks/gpu_checks.py has one subcommand per check):
#  held     what a suspended process still holds (NVML), for Lightning, HF (fused AdamW),
#           1-rank NCCL DDP and a GradScaler job with fused AdamW: each within the budget
#  exact    interrupted (2 suspends, a restart) == alone, bit for bit: GradScaler with and
#           without torch.compile, both Lightning packages, HF (fused AdamW)
#  zygote   no libcuda in the zygote before it forks; a warm job's thread count and GPU
#  uuid     an agent under CUDA_VISIBLE_DEVICES=<UUID> passes the UUID on to its job
#  pack     a memory-tight packed pair: caps, the one that grows past its cap fails alone
#  memory   suspend gives 1 GB back to the driver, resume restores it (CUDA-only)
#  nccl     a 1-rank NCCL job agreeing through its gloo group, suspended, resumed, restarted
#           (CUDA-only)
# Each check's limit is at least twice its dry run's time (the dry run fails otherwise);
# every wait inside a check ends 10 s before its limit, so a timeout names the step.
# (gpu_checks.py frameworks, Lightning and HF jobs time-sliced by the driver, runs apart:
#  it does not fit the 6 minutes beside the rest)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
dry=""
[ "${1:-}" = "--dry-run" ] && dry=1
# the repository's venv where it sees the GPU (in a dry run: where it is), else python3
py=python3
if [ -n "$dry" ]; then [ -x .venv/bin/python ] && py=.venv/bin/python
elif [ -x .venv/bin/python ] && .venv/bin/python -c "import torch; assert torch.cuda.is_available()" \
  2>/dev/null; then py=.venv/bin/python
fi
# prerequisites first, each missing one named (a check that cannot start is no measurement)
missing=()
command -v timeout >/dev/null || missing+=("timeout (coreutils)")
if [ -z "$dry" ]; then
  command -v nvidia-smi >/dev/null || missing+=("nvidia-smi")
  $py -c "import torch; assert torch.cuda.is_available()" 2>/dev/null \
    || missing+=("a PyTorch that sees a GPU ($py)")
fi
# (found, not imported: each import of torch's users takes seconds)
while read -r module; do missing+=("python module $module ($py)"); done < <($py -c "
import importlib.util
for m in ('torch', 'lightning', 'pytorch_lightning', 'transformers', 'pynvml',
          'sortedcontainers', 'pydantic'):
    if importlib.util.find_spec(m) is None:
        print(m)" 2>/dev/null || echo "python3 itself")
if [ ${#missing[@]} -gt 0 ]; then
  printf 'missing: %s\n' "${missing[@]}"
  echo "=== no check ran: $(IFS=,; echo "${missing[*]}") missing"
  exit 100
fi
# gandiva from this tree, and its Lightning entry points (what `pip install` would declare)
ep=/tmp/gandiva-ep/gandiva-0.0.dist-info
mkdir -p "$ep"
printf 'Metadata-Version: 2.1\nName: gandiva\nVersion: 0.0\n' > "$ep/METADATA"
$py - "$ep/entry_points.txt" <<'EOF'
import sys, tomllib
groups = tomllib.load(open("pyproject.toml", "rb"))["project"]["entry-points"]
with open(sys.argv[1], "w") as f:
    for group, entries in groups.items():
        f.write(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))
EOF
export PYTHONPATH="$PWD:/tmp/gandiva-ep${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ -n "$dry" ]; then echo "dry run: CPU slots standing in for a GPU, NVML faked" > "$out/gpu.txt"
else nvidia-smi --query-gpu=name,memory.total,driver_version,uuid --format=csv > "$out/gpu.txt"
fi
cat "$out/gpu.txt"
$py -c "import torch, lightning, transformers; print('torch', torch.__version__, \
'lightning', lightning.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
leftovers() {  # the processes of a check: its own TMPDIR is in their environment (its
    # agents make each job's TMPDIR under it, and jobs start in sessions of their own)
    local p
    for p in /proc/[0-9]*; do
        grep -qz "^TMPDIR=$1" "$p/environ" 2>/dev/null && echo "${p#/proc/}"
    done
}
cuda_only=" memory nccl "
check() {  # check NAME SECONDS: one subcommand of gpu_checks.py, its output kept, its
    # verdict in $out/NAME.failed if it failed
    echo; echo "=== $1 (at most $2 s)"
    if [ -n "$dry" ] && [[ "$cuda_only" == *" $1 "* ]]; then
        echo "=== $1 skipped: CUDA-only"; return
    fi
    local tmp start took why
    tmp="$(cd "$out" && pwd)/tmp-$1"
    mkdir -p "$tmp"
    start=$SECONDS
    # SIGKILL 10 s past the limit; then whatever of it is left, so that no job of one check
    # distorts the next
    TMPDIR="$tmp" timeout -k 10 "$2" $py benchmarks/gpu_checks.py "$1" --limit "$2" \
        ${dry:+--dry-run} > "$out/$1.txt" 2>&1
    local rc=$?
    took=$((SECONDS - start))
    leftovers "$tmp" | xargs -r kill -9 2>/dev/null
    cat "$out/$1.txt"
    why="exit $rc"
    [ "$rc" = 124 ] && why="over its limit"
    if [ "$rc" = 0 ] && [ -n "$dry" ] && [ $((2 * took)) -gt "$2" ]; then
        rc=1 why="its limit, $2 s, is under twice its dry run's $took s"
    fi
    if [ "$rc" = 0 ]; then echo "=== $1 passed in $took s"
    else echo "$why" > "$out/$1.failed"; echo "=== $1 FAILED ($why)"
    fi
}
rm -f "$out"/*.failed
# 380 s in all, under the 10 minutes a lent machine's command may run. On a
# GPU one after another (each measures the GPU); a dry run in two lanes at once (on 2
# cores, each check is its imports and its jobs' starts)
if [ -n "$dry" ]; then
    check exact 150 > "$out/lane-1.log" 2>&1 &
    { check held 60; check zygote 30; check uuid 30; check pack 40; } > "$out/lane-2.log" 2>&1
    wait
    cat "$out/lane-2.log" "$out/lane-1.log"
    check memory 30
    check nccl 40
else
    check held 60
    check exact 150
    check zygote 30
    check uuid 30
    check pack 40
    check memory 30
    check nccl 40
fi
failed=()
for f in "$out"/*.failed; do [ -e "$f" ] && failed+=("$(basename "$f" .failed)"); done
echo
if [ ${#failed[@]} -eq 0 ]; then echo "=== every check passed"
else echo "=== ${#failed[@]} check(s) failed: ${failed[*]}"
fi
exit "${#failed[@]}"
