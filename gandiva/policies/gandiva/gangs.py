"""How a gang wider than a server takes its turn in a round (the paper does not say).

``used`` (the default): it takes only the GPUs it uses on each server of its home, server by
server in home order, and narrower jobs have the rest. ``whole``: it takes its servers whole,
and only servers no job before it in the order took room on. Taking servers whole idled 2 GPUs
at every turn of a 6-GPU gang on two 4-GPU servers (docs/decisions/0006).
"""

from __future__ import annotations

from gandiva.policies.gandiva.order import Slot


class GangShares:
    def __init__(self, used: bool) -> None:
        self.used = used

    def share(self, sl: Slot, room: dict[int, int], size: dict[int, int]
              ) -> tuple[int, ...] | None:
        """The GPUs a gang takes on each server of its home in a round, given the ``room``
        left there (every server of its home is in it); None if it does not fit. A running
        gang takes what it holds."""
        if sl.gpus and self.used:
            return sl.share if all(room[t] >= k for t, k in zip(sl.home, sl.share, strict=True)) \
                else None
        return self.share_on(sl.home, sl.width, room, size)

    def share_on(self, home: tuple[int, ...], width: int, room: dict[int, int],
                 size: dict[int, int]) -> tuple[int, ...] | None:
        """The GPUs a waiting gang of ``width`` takes on each server of ``home`` given the
        ``room`` left there; None if it does not fit."""
        if not self.used:
            if any(room[t] < size[t] for t in home):
                return None
            return tuple(size[t] for t in home)
        left, share = width, []
        for t in home:
            k = min(left, room[t])
            share.append(k)
            left -= k
        return tuple(share) if left == 0 else None

    def taken(self, room: int, k: int) -> int:
        """The room a gang's share of ``k`` GPUs leaves on a server with ``room``."""
        return room - k if self.used else 0
