"""Locality-aware bin-packing of a gang onto free GPUs (shared by the baselines).

A job that fits in one server goes to the server with the fewest free GPUs that still holds it
(best fit keeps whole servers free for big jobs), on as few sockets as possible. A bigger job
takes whole free servers, racks kept together, then the servers with the most free GPUs.
"""

from __future__ import annotations

from collections.abc import Callable

from gandiva.state import Cluster


def pick_in_server(cluster: Cluster, node: int, count: int) -> list[int]:
    """``count`` free GPUs of one server, filling the socket with fewest free GPUs that fits."""
    return pick(cluster.free_gpus(node), lambda g: cluster.gpus[g].socket, count)


def pick(free: list[int], socket_of: Callable[[int], int], count: int) -> list[int]:
    """``pick_in_server`` on a list of free GPUs (a plan's, or the state's)."""
    if count == len(free):
        return list(free)
    by_socket: dict[int, list[int]] = {}
    for g in free:
        by_socket.setdefault(socket_of(g), []).append(g)
    fitting = [s for s in by_socket.values() if len(s) >= count]
    if fitting:
        return min(fitting, key=len)[:count]
    picked: list[int] = []
    for s in sorted(by_socket.values(), key=len, reverse=True):
        picked.extend(s[: count - len(picked)])
        if len(picked) == count:
            break
    return picked


def best_fit(cluster: Cluster, count: int) -> tuple[int, ...] | None:
    """Free GPUs for a gang of ``count``, consolidated where possible; None if too few are free."""
    top = cluster.max_free_bucket
    if count <= top:
        for have in range(count, top + 1):
            for node in cluster.nodes_with_free(have):
                return tuple(pick_in_server(cluster, node, count))
    if cluster.free_count() < count:
        return None
    picked: list[int] = []
    for have in range(top, 0, -1):  # whole free servers first, then the emptiest
        nodes = sorted(cluster.nodes_with_free(have), key=lambda n: (cluster.nodes[n].rack, n))
        for node in nodes:
            take = min(have, count - len(picked))
            picked.extend(pick_in_server(cluster, node, take))
            if len(picked) == count:
                return tuple(picked)
    return None
