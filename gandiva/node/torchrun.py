"""Commands that start with torchrun: gandiva is the launcher.

torchrun starts ``--nproc-per-node`` workers per node and rendezvouses them. Gandiva's agent
already does that: it starts one process per rank, with torchrun's whole environment
(``RANK`` ... ``TORCHELASTIC_RUN_ID``, see ``agent.torchrun_env``), and restarts a crashed
gang from its checkpoint as torchrun's ``--max-restarts`` does. Run as written, each of a
4-GPU job's 4 processes would start its own torchrun with 4 workers: 16 processes on 4
devices, four rendezvous at once, all on one port. So the command is unwrapped: each rank
runs torchrun's training script (``-m`` module, or ``--no-python`` program) itself.

Decision: the job spec's ``gpus`` is the one width; a torchrun ``--nnodes`` x
``--nproc-per-node`` that says otherwise is refused when the spec is submitted (see
``worker_count``), and torchrun's rendezvous, restart and logging options are dropped.
"""

from __future__ import annotations

import os

_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")


def _torchrun_args(command: list[str]) -> list[str] | None:
    """torchrun's own arguments, if ``command`` runs torchrun; else None."""
    if not command:
        return None
    if os.path.basename(command[0]) == "torchrun":
        return command[1:]
    if len(command) > 2 and command[1] == "-m" and command[2] in _LAUNCHERS:
        return command[3:]
    return None


def _parse(args: list[str]):
    from torch.distributed.run import get_args_parser

    def refuse(message: str):
        raise ValueError(f"torchrun's arguments do not parse: {message}")

    def asks_to_exit(status: int = 0, message: str | None = None):
        refuse(f"{' '.join(args)} would have torchrun exit, not run a script")

    parser = get_args_parser()
    parser.set_defaults(nproc_per_node=None)  # tell "not given" from "1"
    # argparse would print (to the server's log) and exit the process: refused instead
    parser.error = refuse  # type: ignore[method-assign]
    parser.exit = asks_to_exit  # type: ignore[method-assign,assignment]  # (--help)
    parser.print_help = lambda file=None: None  # type: ignore[method-assign]
    return parser.parse_args(args)


def unwrap(command: list[str], python: str = "{python}") -> list[str]:
    """The command one rank runs: ``command`` itself, or what torchrun would start."""
    args = _torchrun_args(command)
    if args is None:
        return command
    parsed = _parse(args)
    script = [parsed.training_script, *parsed.training_script_args]
    if parsed.no_python:
        return script
    if parsed.module:
        return [python, "-m", *script]
    return [python, *script]


def worker_count(command: list[str]) -> int | None:
    """How many workers a torchrun command asks for (``--nnodes`` x ``--nproc-per-node``),
    if it says so in numbers; None for other commands or where torchrun would decide."""
    args = _torchrun_args(command)
    if args is None:
        return None
    try:
        parsed = _parse(args)
    except ImportError:  # a client without torch (gandiva's core install): the server checks
        return None
    nodes, _, most = str(parsed.nnodes).partition(":")
    if parsed.nproc_per_node is None or not str(parsed.nproc_per_node).isdigit():
        return None
    if most and most != nodes or not nodes.isdigit():
        return None  # an elastic node range: the width is gandiva's to choose
    return int(nodes) * int(parsed.nproc_per_node)
