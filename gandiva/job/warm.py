"""Warm starts: a zygote, Python with PyTorch and the job library already imported, that
forks a process for each job.

Starting a fresh Python and importing torch takes about 3 s of CPU here, far more than a
small job's first mini-batches or the restore of a small checkpoint: without warm starts, a
migration of an 8 MB job costs ten times the paper's 0.22 s, and a search that judges each
trial after 100 mini-batches spends most of its time importing. As the paper warms the
destination before it moves a job, the agent keeps one zygote per node; a fork of it is
ready in ~10 ms and shares the zygote's memory until it writes to it.

The protocol (``wire``): the zygote says ``Ready`` once its imports are done. For ``Fork``
(with a socket passed by SCM_RIGHTS) it forks a child, answers ``Forked(pid)``, and when a
child ends, ``Exited(pid, code)``: it is the children's parent, so only it learns their exit
status. The child is a warm process: on ``Become`` (argv, environment, working directory,
account, and the log file's descriptor) on its socket, it drops to the job's account, takes
on its environment and log and runs the script as
``__main__``; when the script ends, the interpreter exits as after ``python script.py``
(exit status, traceback, ``atexit`` handlers), but with the script's process groups
destroyed first (see ``wind_down``). A job that starts cold runs through the same end:
``python -m gandiva.job.warm --cold script.py ARGS`` (see ``cold``).

Decisions: the zygote imports only, it computes nothing. PyTorch's CPU thread pools (OpenMP)
are not safe to fork once started, and CUDA is never touched before the child has the job's
CUDA_VISIBLE_DEVICES. A child starts its own session, so the agent signals it as a group.
"""

from __future__ import annotations

import os
import runpy
import selectors
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

from gandiva.job import output, wire

# what a job's first mini-batches would import lazily (torch._dynamo: about 1 s here)
PRELOAD = ("torch", "torch.nn", "torch.optim", "torch._dynamo", "gandiva.job")


def preload() -> None:
    for name in PRELOAD:
        __import__(name)


def zygote(sock: socket.socket) -> socket.socket:
    """Serve ``Fork`` requests on ``sock`` until it closes (then exit). Returns only in a
    forked child: its control channel."""
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w.fileno())
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    sock.sendall(wire.encode(wire.Ready()))
    while True:
        for key, _ in sel.select():
            if key.fileobj is wake_r:
                try:
                    wake_r.recv(4096)
                except BlockingIOError:
                    pass
                continue
            data, fds, _, _ = socket.recv_fds(sock, 4096, 1)
            if not data:
                sys.exit(0)  # the agent closed the channel
            wire.command(data)  # a Fork: nothing else is sent here
            channel = socket.socket(fileno=fds[0])
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for s in (sock, wake_r, wake_w):
                    s.close()
                sel.close()
                os.setsid()
                return channel
            channel.close()
            sock.sendall(wire.encode(wire.Forked(pid)))
        while True:  # reap every child that ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            sock.sendall(wire.encode(wire.Exited(pid, os.waitstatus_to_exitcode(status))))


def become(channel: socket.socket) -> None:
    """Wait for ``Become`` on ``channel`` (its log file with its first byte) and run the
    job's script as ``__main__``."""
    try:
        line, fds, _, _ = socket.recv_fds(channel, 1, 1)
    except OSError:
        line, fds = b"", []
    while line and not line.endswith(b"\n"):  # byte by byte: what follows is the job's
        try:
            c = channel.recv(1)
        except OSError:
            c = b""
        if not c:
            break
        line += c
    if not line.endswith(b"\n") or not fds:
        sys.exit(0)  # the agent closed it before giving a job
    fd = channel.detach()  # the fd stays open: it is the job's control channel now
    go = wire.command(line)
    assert isinstance(go, wire.Become), go
    enter(go, fds[0], fd)


def enter(go: wire.Become, log: int, control_fd: int | None = None) -> None:
    """Become the job ``go`` names in this process (its account, environment, directory and
    arguments) and run its script, its output to the open file ``log``; ``control_fd``: its
    channel to the agent, if it has one."""
    os.dup2(log, 1)  # from here on, errors go to the job's own log
    os.dup2(log, 2)
    os.close(log)
    if go.cgroup is not None:  # before it can fork
        from gandiva.node.cgroups import join

        join(Path(go.cgroup))
    if go.uid is not None and go.gid is not None:  # before anything of the job's is read
        from gandiva.node.accounts import Account, drop

        drop(Account(go.uid, go.gid, tuple(go.groups)))
    os.environ.clear()
    os.environ.update(go.env)
    if control_fd is not None:
        os.environ["GANDIVA_CONTROL_FD"] = str(control_fd)
    tempfile.tempdir = None  # found again from the job's TMPDIR (the zygote's imports asked)
    reseed()
    os.chdir(go.cwd)
    sys.argv = go.argv
    sys.path[0] = os.path.dirname(os.path.abspath(go.argv[0]))
    set_threads()
    run(go.argv[0])


def reseed() -> None:
    """Give NumPy's global generator fresh entropy, as a cold start's import does: the
    zygote's imports seeded it once, and every fork would draw the same numbers (CPython
    reseeds ``random`` at fork by itself; torch's default seed is the same in every process
    anyway, cold or warm)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def set_threads() -> None:
    """Size torch's CPU pool from the job's OMP_NUM_THREADS: torch read the variable when
    the zygote imported it, before this job's environment was known."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        import torch

        torch.set_num_threads(int(value))


def run(path: str) -> None:
    """Run the script as ``__main__``, then end as ``python script.py`` would: the same
    traceback, exit status and ``atexit`` handlers, after ``wind_down``. Only the status is
    kept from how the script ended: its exception would keep the script's frames alive."""
    code: str | int | None = 0
    interrupted = False
    output.install()  # a full disk drops log lines, not the job
    no_context_in_backward()
    if os.environ.get("GANDIVA_RENDEZVOUS_FILE"):
        rendezvous_in_a_file(os.environ["GANDIVA_RENDEZVOUS_FILE"])
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as stop:
        code = stop.code
    except BaseException as err:  # noqa: BLE001 - printed and turned into a status below
        sys.excepthook(type(err), err, err.__traceback__)  # before atexit, as Python does
        code, interrupted = 1, isinstance(err, KeyboardInterrupt)
        if _out_of_memory(err):
            code = OUT_OF_MEMORY
    wind_down(destroy=code in (0, None))
    if interrupted:  # Python dies of SIGINT then
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(code)


def no_context_in_backward() -> None:
    """Run backward passes without putting a Python object in the thread's state, unless a
    compiled backward needs it.

    torch (2.13) stashes ``contextvars.copy_context()`` in its thread-local state for every
    backward (``autograd.graph._engine_run_backward``), for AOT-compiled backward code to
    read. Every collective a DDP reducer starts during the backward captures that state; a
    gloo work destroyed on its worker thread must then take the GIL to drop the context.
    When the script's end destroys the process group while holding the GIL, its destructor
    joins that worker, which waits for the GIL: the gang's rank hangs for ever (issue 54's
    stack, reproduced with plain DDP scripts time-sliced under load). Without a compiled
    backward (dynamo's AOT count at 0) the context is read by nothing, so it is not stashed;
    with one, torch's own path runs."""
    if "torch.autograd" not in sys.modules:  # a cold start: when the script imports it
        sys.meta_path.insert(0, _OnImport("torch.autograd", no_context_in_backward))
        return
    import torch.autograd as autograd
    import torch.autograd.graph as graph
    from torch.autograd.variable import Variable

    stashing = graph._engine_run_backward  # type: ignore[attr-defined]

    def run_backward(t_outputs, *args, **kwargs):  # type: ignore[no-untyped-def]
        utils = sys.modules.get("torch._dynamo.utils")
        if utils is not None and utils.counters["aot_autograd"]["total"]:
            return stashing(t_outputs, *args, **kwargs)
        return Variable._execution_engine.run_backward(t_outputs, *args, **kwargs)

    setattr(graph, "_engine_run_backward", run_backward)  # noqa: B010 - (torch's own
    setattr(autograd, "_engine_run_backward", run_backward)  # noqa: B010 - private names)


class _OnImport:
    """Call ``then()`` once the module ``name`` has been imported (and only then: a cold
    start does not import torch before its script does)."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run, then = spec.loader.exec_module, self.then

        def exec_module(module: ModuleType) -> None:
            run(module)
            then()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


# A script that died of running out of device memory (torch.OutOfMemoryError, as a cap
# raises it) exits with this: the agent then tells the scheduler (a packed job outgrew its
# share of the GPU), rather than count a crash
OUT_OF_MEMORY = 86


def _out_of_memory(err: BaseException) -> bool:
    torch = sys.modules.get("torch")
    kind = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return kind is not None and isinstance(err, kind)


def rendezvous_in_a_file(path: str) -> None:
    """Make ``env://`` (what ``init_process_group`` uses unless told otherwise, as
    Lightning, HF and torchrun scripts do) meet at a ``FileStore`` at ``path``: the ranks of
    a job on one machine meet where only its account can reach (the job's TMPDIR), not at a
    TCP store, which listens on every interface with no authentication."""
    import importlib
    from datetime import timedelta
    from urllib.parse import parse_qs, urlparse

    rdzv = importlib.import_module("torch.distributed.rendezvous")

    def handler(url: str, timeout: timedelta = rdzv.default_pg_timeout, **_: object):
        from torch.distributed import FileStore

        query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
        rank = int(query.get("rank", os.environ["RANK"]))
        world = int(query.get("world_size", os.environ["WORLD_SIZE"]))
        store = FileStore(path, world)
        store.set_timeout(timeout)
        yield store, rank, world
        raise RuntimeError("env:// in a file: no second rendezvous (gandiva restarts a job)")

    rdzv._rendezvous_handlers["env"] = handler  # (the public register refuses a second)


def wind_down(destroy: bool = True) -> None:
    """Do what interpreter shutdown does first (wait for the script's non-daemon threads,
    run its ``atexit`` handlers), then destroy its torch.distributed process groups, all
    while every thread can still take the GIL. Not after a failure (``destroy`` False): with
    its peers gone, NCCL's destroy could wait on them, and the agent kills a failed gang.

    A script that never calls ``destroy_process_group`` leaves its groups to shutdown, where
    a group's destructor joins its worker threads, and those take the GIL to free what a
    finished collective captured from Python: once the interpreter is finalizing, they
    cannot. Shutdown then finds nothing of the script's left to run, so it runs as usual."""
    shutdown = getattr(threading, "_shutdown", None)  # what Py_Finalize calls first
    if shutdown is not None:
        shutdown()
    import atexit

    atexit._run_exitfuncs()  # runs and forgets them: shutdown will not run them again
    dist = sys.modules.get("torch.distributed") if destroy else None
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as err:  # noqa: BLE001 - the script's own result stands
        print(f"gandiva: destroying the process groups at exit failed: {err!r}",
              file=sys.stderr)


def cold(argv: list[str]) -> None:
    """``python -m gandiva.job.warm --cold script.py ARGS``: a cold start, a fresh
    interpreter, that runs the script as ``python script.py ARGS`` does and ends as a warm
    process does (``wind_down``)."""
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    run(argv[0])


def main() -> None:
    if sys.argv[1:2] == ["--cold"]:
        cold(sys.argv[2:])
        return
    sock = socket.socket(fileno=int(os.environ["GANDIVA_CONTROL_FD"]))
    preload()
    become(zygote(sock))


if __name__ == "__main__":
    main()
