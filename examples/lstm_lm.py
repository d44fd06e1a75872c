"""A small character-level LSTM language model on the Zen of Python (shipped with Python).

Batch ``step`` is a set of windows at offsets drawn from a generator seeded with (seed, step),
so a restarted or moved run sees the same batches as an uninterrupted one.

    python examples/lstm_lm.py --steps 300
"""

import argparse
import codecs
import contextlib
import io

import torch
from torch import nn

import gandiva.job as gj

with contextlib.redirect_stdout(io.StringIO()):  # importing it prints the Zen
    import this
TEXT = codecs.decode(this.s, "rot13")  # the module keeps the text rot13-encoded


class LM(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x):
        h, _ = self.lstm(self.embed(x))
        return self.out(h)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    job = gj.init()
    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT])
    torch.manual_seed(args.seed)
    model = LM(len(chars), args.hidden).to(job.device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    job.register(model=model, optimizer=opt)
    loss = torch.tensor(float("nan"))
    for step in job.steps(args.steps):
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        starts = torch.randint(0, len(data) - args.window - 1, (args.batch,), generator=g)
        x = torch.stack([data[s:s + args.window] for s in starts]).to(job.device)
        y = torch.stack([data[s + 1:s + args.window + 1] for s in starts]).to(job.device)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, len(chars)), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        job.report(samples=args.batch, loss=loss.item())
    print(f"done: {args.steps} steps, last loss {loss.item():.4f} nats/char")


if __name__ == "__main__":
    main()
