"""A job that writes what its process saw, as JSON lines, to the file argv[1]: one line when
it starts (its pid, environment and device), one at each step where its memory cap changed,
and one at its end. argv[2]: steps; argv[3]: "in-place" for a loop that may move in place."""

import json
import os
import sys
import time

import torch

import gandiva.job as gj

out, total = sys.argv[1], int(sys.argv[2])
in_place = len(sys.argv) > 3 and sys.argv[3] == "in-place"


def write(**record) -> None:
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")


job = gj.init()
model = torch.nn.Linear(4, 4).to(job.device)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
job.register(model=model, optimizer=opt)
seen = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "GANDIVA_DEVICE", "LOCAL_RANK",
                                       "RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")}
cap = job.memory_cap_gb
started = False
for step in job.steps(total, in_place=in_place):
    if not started:  # after the restore: the step it goes on from
        write(event="start", pid=os.getpid(), step=step, device=str(job.device),
              rank=job.rank, cap=cap, **seen)
        started = True
    if job.memory_cap_gb != cap:
        cap = job.memory_cap_gb
        write(event="cap", pid=os.getpid(), step=step, cap=cap)
    opt.zero_grad()
    model(torch.ones(2, 4, device=job.device)).sum().backward()
    opt.step()
    time.sleep(0.01)
write(event="end", pid=os.getpid(), step=job.step, rank=job.rank)
