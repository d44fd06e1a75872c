"""A Hugging Face ``Trainer`` script: a tiny BERT (built from a config, no download) learning
whether a synthetic token sequence holds more of token 7 than of token 8.

    python examples/hf_bert.py --max-steps 300          # alone
    torchrun --nproc-per-node 2 examples/hf_bert.py     # data parallel (DDP)
    # under gandiva, the one changed line is hf.train(trainer) (was trainer.train()):
    # the job is then time-sliced, moved, resized and restarted through the Trainer's own
    # checkpoints

The data is generated from a seed, so every run sees the same examples, and the Trainer's
seeded sampler draws the same order in every epoch of every run, at any width.
"""

import argparse
import tempfile

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from gandiva.job.integrations import hf

VOCAB, LENGTH = 32, 16


class Sequences(torch.utils.data.Dataset):
    def __init__(self, size: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, VOCAB, (size, LENGTH), generator=g)
        self.labels = ((self.ids == 7).sum(1) > (self.ids == 8).sum(1)).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--examples", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=16, help="per device")
    ap.add_argument("--accumulate", type=int, default=1, help="gradient accumulation steps")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-steps", type=int, default=0, help="evaluate every N steps")
    ap.add_argument("--eval-examples", type=int, default=256)
    ap.add_argument("--save-strategy", default="no", choices=["no", "steps", "epoch", "best"])
    ap.add_argument("--save-steps", type=int, default=100)
    ap.add_argument("--output-dir", default=None, help="the Trainer's (default: a temp dir)")
    return ap.parse_args(argv)


def build(args: argparse.Namespace) -> Trainer:
    torch.manual_seed(args.seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=LENGTH, num_labels=2,
                        hidden_dropout_prob=args.dropout,
                        attention_probs_dropout_prob=args.dropout)
    model = BertForSequenceClassification(config)
    evaluating = args.eval_steps > 0
    training = TrainingArguments(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="hf-bert-"),
        max_steps=args.max_steps, per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=args.accumulate,
        learning_rate=args.lr, seed=args.seed, logging_steps=10,
        save_strategy=args.save_strategy, save_steps=args.save_steps,
        eval_strategy="steps" if evaluating else "no", eval_steps=args.eval_steps or None,
        metric_for_best_model="loss" if args.save_strategy == "best" else None,
        report_to=[], disable_tqdm=True, dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available())  # CPU slots: DDP over gloo under torchrun
    held_out = Sequences(args.eval_examples, args.seed + 1000) if evaluating else None
    return Trainer(model=model, args=training,
                   train_dataset=Sequences(args.examples, args.seed), eval_dataset=held_out)


def main() -> None:
    trainer = build(parse())
    hf.train(trainer)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    print(f"done: {trainer.state.global_step} steps, "
          f"last loss {losses[-1] if losses else float('nan'):.4f}; "
          f"{trainer.args.world_size} process(es), {trainer.args.parallel_mode.value}, "
          f"n_gpu {trainer.args.n_gpu}, model wrapped as "
          f"{type(trainer.model_wrapped).__name__}")


if __name__ == "__main__":
    main()
