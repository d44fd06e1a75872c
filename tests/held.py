"""How much memory Python held while a block ran (``tracemalloc``): what a test bounds where a
request or a job could make the server hold without end."""

from __future__ import annotations

import tracemalloc


class Held:
    """``with Held() as held: ...``, then ``held.mib``: the most Python held in the block."""

    mib = 0.0

    def __enter__(self) -> Held:
        tracemalloc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.mib = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
