#!/usr/bin/env bash
# GPU checks, for when a GPU machine is lent: one script, under 8 minutes on one GPU.
#   bash benchmarks/gpu_check.sh         (from the repository root; writes $OUT or ./gpu-out)
# It uses the machine's own python3 and PyTorch (a lent machine reaches no package index);
# Lightning and transformers are there too. Each step prints what it measured:
# 1. suspend through the library frees device memory (the allocator's and nvidia-smi's view)
#    and resume restores it, for 1 GB of state;
# 2. suspend+resume latency for 100 MB and 1 GB against a plain device<->host copy, migration
#    against save+load, time-slicing overhead, two jobs packed on one GPU against each alone
#    (benchmarks/mechanisms.py --device cuda);
# 3. a 1-rank NCCL DDP job (examples/ddp.py, launched as torchrun) agreeing through its gloo
#    control group, suspended, resumed and restarted; the boundary's cost on the GPU;
# 4. the Lightning and HF examples, two of each, time-sliced on the one GPU by gandiva.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
py=python3
[ -x .venv/bin/python ] && .venv/bin/python -c "import torch; assert torch.cuda.is_available()" \
  2>/dev/null && py=.venv/bin/python
# gandiva from this tree, and its Lightning entry point (what `pip install` would declare)
ep=/tmp/gandiva-ep/gandiva-0.0.dist-info
mkdir -p "$ep"
printf 'Metadata-Version: 2.1\nName: gandiva\nVersion: 0.0\n' > "$ep/METADATA"
printf '[lightning.pytorch.callbacks_factory]\ngandiva = gandiva.job.integrations.lightning:callbacks\n' \
  > "$ep/entry_points.txt"
export PYTHONPATH="$PWD:/tmp/gandiva-ep${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
$py -c "import torch, lightning, transformers; print('torch', torch.__version__, \
'lightning', lightning.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
step() { echo; echo "=== $1"; }
step "1. suspend frees device memory"
timeout 60 $py benchmarks/gpu_checks.py memory --mb 1000 2>&1 | tee "$out/memory.txt"
step "2. mechanisms on the GPU"
timeout 200 $py benchmarks/mechanisms.py --device cuda --sizes 100,1000 2>&1 \
  | tee "$out/mechanisms_cuda.txt"
step "3. NCCL through the agreement; the boundary's cost"
timeout 60 $py benchmarks/gpu_checks.py nccl 2>&1 | tee "$out/nccl.txt"
timeout 30 $py benchmarks/boundary_cost.py --device cuda --ranks 1 2>&1 | tee "$out/boundary.txt"
step "4. Lightning and HF time-sliced on the GPU"
timeout 150 $py benchmarks/gpu_checks.py frameworks 2>&1 | tee "$out/frameworks.txt"
