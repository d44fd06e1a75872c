"""A multi-node Ray cluster on this one machine, to try the ray backend without machines:
a head and N worker nodes with G GPUs each (CPU slots stand in for GPUs without CUDA).

    python examples/ray_local_cluster.py --nodes 3 --gpus 2   # prints the address; Ctrl-C ends
    gandiva server --backend ray --ray-address <address>
    kill -USR1 <its pid>      # one more node joins (the server takes it up within seconds)
"""

import argparse
import os
import secrets
import signal
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on 127.0.0.1
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray's token authentication: only a process that holds the token (in Ray's default place,
# ~/.ray/auth_token, made here if missing, as `ray get-auth-token --generate` does) can use
# the cluster; the gandiva server finds it there too. A root server's jobs never can.
os.environ.setdefault("RAY_AUTH_MODE", "token")
TOKEN = Path.home() / ".ray" / "auth_token"
if os.environ["RAY_AUTH_MODE"] == "token" and not (
        "RAY_AUTH_TOKEN" in os.environ or "RAY_AUTH_TOKEN_PATH" in os.environ or TOKEN.exists()):
    TOKEN.parent.mkdir(mode=0o700, exist_ok=True)
    TOKEN.touch(mode=0o600)
    TOKEN.write_text(secrets.token_hex(32))

from ray.cluster_utils import Cluster  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=2, help="GPUs (or CPU slots) per worker node")
    args = ap.parse_args()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    for _ in range(args.nodes):
        cluster.add_node(num_cpus=args.gpus, num_gpus=args.gpus)
    cluster.wait_for_nodes()
    print(cluster.address, flush=True)
    stop, grow = [], []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGUSR1, lambda *_: grow.append(1))
    try:
        while not stop:
            time.sleep(0.5)
            while grow:
                grow.pop()
                cluster.add_node(num_cpus=args.gpus, num_gpus=args.gpus)
                print(f"a node joined: {len(cluster.list_all_nodes()) - 1} worker nodes",
                      flush=True)
    except KeyboardInterrupt:
        pass
    cluster.shutdown()


if __name__ == "__main__":
    main()
