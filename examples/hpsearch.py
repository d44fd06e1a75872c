"""A hyper-parameter search through gandiva's Python API: the LSTM language model at several
learning rates and sizes, scheduled by ``gandiva`` on this machine's devices.

    python examples/hpsearch.py [--policy gandiva:quantum=5] [--trials 6]

Every trial reports its loss early (time-slicing gives each a turn within seconds), which is
what lets a search stop bad configurations long before FIFO would have started them.
"""

import argparse
import itertools
from pathlib import Path

from gandiva.backends.driver import Driver
from gandiva.node.agent import Launch
from gandiva.policies import make_policy
from gandiva.spec import JobSpec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="gandiva:quantum=5")
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--out", default="hpsearch-out")
    args = ap.parse_args()

    script = Path(__file__).with_name("lstm_lm.py")
    backend = Driver(make_policy(args.policy), Path(args.out),
                           feedback_steps=args.steps // 10)
    grid = itertools.islice(itertools.product((0.003, 0.01, 0.03), (32, 64, 128)), args.trials)
    for i, (lr, hidden) in enumerate(grid):
        backend.submit(JobSpec(f"lr{lr}-h{hidden}", 0.0, 1, "lstm", mini_batches=args.steps),
                       Launch(["{python}", str(script), "--steps", str(args.steps),
                               "--lr", str(lr), "--hidden", str(hidden), "--seed", str(i)]))
    result = backend.run()
    print(f"{'trial':<16}{'first feedback':>16}{'done at':>10}{'final loss':>12}")
    for job in sorted(result.jobs, key=lambda j: j.metrics.get("loss", 1e9)):
        print(f"{job.spec.id:<16}{job.first_feedback or 0:>15.1f}s{job.finish or 0:>9.1f}s"
              f"{job.metrics.get('loss', float('nan')):>12.4f}")


if __name__ == "__main__":
    main()
