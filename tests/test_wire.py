"""The agent and a job speak one typed protocol: each message survives the wire as itself,
and what is not one of ours is refused, naming it."""

import dataclasses

import pytest

from gandiva.job import wire

MESSAGES = [
    wire.Suspend(), wire.Resume("cuda:1"), wire.Checkpoint(exit=True),
    wire.Checkpoint(periodic=True), wire.Become(["train.py", "--lr", "0.1"], {"A": "1"}, "/w"),
    wire.Become(["t.py"], {}, "/w", uid=61200, gid=61200, groups=[61200, 27]),
    wire.Fork(), wire.Ready(), wire.Forked(4242), wire.Exited(4242, -9),
    wire.Hello(pid=42, rank=3), wire.Started(7, 5),
    wire.Profile(9, mini_batch_time=0.25, memory_gb=1.5, utilization=0.8, samples_per_s=128.0,
                 metrics={"loss": 0.5}, series={"loss": [[8, 0.6], [9, 0.5]]}),
    wire.Suspended(9, 0.01), wire.Resumed(9, "cpu", 0.02), wire.Checkpointed(9, None),
    wire.Done(100),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_decodes_to_what_was_encoded(message):
    line = wire.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # one JSON object a line
    decode = wire.command if isinstance(message, wire.Command) else wire.report
    assert decode(line) == message


def test_a_field_a_newer_peer_adds_is_ignored_and_a_stranger_is_refused():
    line = wire.encode(wire.Done(5)).replace(b"}", b', "extra": 1}')
    assert wire.report(line) == wire.Done(5)
    with pytest.raises(ValueError, match="not a gandiva 'ev' message"):
        wire.report(b'{"ev": "bogus"}')
    with pytest.raises(ValueError, match="not a gandiva 'op' message"):
        wire.command(wire.encode(wire.Done(5)))  # a report is no command


def test_commands_and_reports_are_told_apart_by_their_tag():
    assert {type(m).__name__ for m in MESSAGES if isinstance(m, wire.Command)} == {
        "Suspend", "Resume", "Checkpoint", "Fork", "Become"}
    assert all(dataclasses.is_dataclass(m) for m in MESSAGES)
