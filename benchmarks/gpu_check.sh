#!/usr/bin/env bash
# GPU checks, for when a GPU machine is lent: one short script, about 5 minutes.
#   bash benchmarks/gpu_check.sh            (from the repository root; writes $OUT or ./gpu-out)
# 1. the runtime tests on the GPU (suspend/resume frees device memory, moves between GPUs);
# 2. the mechanism benchmark on cuda (suspend/resume vs a plain device<->host copy, migration
#    vs checkpoint save+load for 10 MB..1 GB, time-slicing overhead, packing);
# 3. the demo on the GPUs, fifo vs gandiva.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv && .venv/bin/pip install --quiet -e '.[test]'
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
.venv/bin/python - <<'PY' 2>&1 | tee "$out/cuda_suspend.txt"
# suspend through the library frees the GPU's memory, cache included, and resume restores it
import torch
from gandiva.runtime.job import Job
job = Job({"GANDIVA_DEVICE": "cuda:0"})
model = torch.nn.Linear(4096, 4096).cuda()
opt = torch.optim.Adam(model.parameters())
model(torch.randn(64, 4096, device="cuda")).sum().backward(); opt.step()
job.register(model=model, optimizer=opt)
before = torch.cuda.memory_reserved()
job._to("cpu")
after = torch.cuda.memory_reserved()
job._to(torch.device("cuda", 0))
print(f"reserved before suspend {before/2**20:.0f} MB, after {after/2**20:.0f} MB, "
      f"resumed on {next(model.parameters()).device}")
assert after < before / 10, "suspend did not free the GPU memory"
PY
timeout 240 .venv/bin/python benchmarks/mechanisms.py --device cuda --sizes 10,100,1000 \
  2>&1 | tee "$out/mechanisms_cuda.txt"
timeout 200 .venv/bin/gandiva demo --steps 3000 --out "$out/demo" --json "$out/demo.json" \
  2>&1 | tee "$out/demo.txt"
