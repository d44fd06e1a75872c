"""A warm process: Python with PyTorch and the job library already imported, waiting to
become a job.

Starting a fresh Python and importing torch takes about 2 s here, far more than restoring a
small checkpoint: without a warm process, a migration of an 8 MB job costs ten times the
paper's 0.22 s. As the paper warms the destination before it moves a job, the agent keeps a
few of these ready. On "go" (one line on the control channel: argv, environment, working
directory, log file) the process takes on the job's environment and log, and runs the script
as ``__main__``. It never touches CUDA before that, so CUDA_VISIBLE_DEVICES still applies.
"""

from __future__ import annotations

import os
import runpy
import socket
import sys

from gandiva.job import wire


def warm_up() -> None:
    """Pay for the imports a job needs before it needs them: torch, and what its first
    optimizer pulls in lazily (about 1 s here, torch._dynamo among it)."""
    import torch

    import gandiva.job  # noqa: F401

    layer = torch.nn.Linear(4, 4)
    for opt in (torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9),
                torch.optim.Adam(layer.parameters())):
        layer(torch.zeros(2, 4)).sum().backward()
        opt.step()
    torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1)


def main() -> None:
    fd = int(os.environ["GANDIVA_CONTROL_FD"])
    warm_up()

    sock = socket.socket(fileno=fd)
    sock.sendall(wire.encode(wire.Ready()))
    line = b""
    while not line.endswith(b"\n"):  # byte by byte: what follows belongs to the job
        try:
            c = sock.recv(1)
        except OSError:
            c = b""
        if not c:
            sys.exit(0)  # the agent closed the pool
        line += c
    sock.detach()  # the fd stays open: it is the job's control channel now
    go = wire.command(line)
    assert isinstance(go, wire.Become), go
    log = os.open(go.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)  # from here on, errors go to the job's own log
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(go.env)
    os.chdir(go.cwd)
    sys.argv = go.argv
    sys.path[0] = os.path.dirname(os.path.abspath(go.argv[0]))
    runpy.run_path(go.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
