"""A Hugging Face ``Trainer`` script: a tiny BERT (built from a config, no download) learning
whether a synthetic token sequence holds more of token 7 than of token 8.

    python examples/hf_bert.py --max-steps 300          # alone
    # under gandiva, the one changed line is hf.train(trainer) (was trainer.train()):
    # the job is then time-sliced, moved and restarted through the Trainer's own checkpoints

The data is generated from a seed, so every run sees the same examples, and the Trainer's
seeded sampler draws the same order in every epoch of every run.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--examples", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", default=None, help="the Trainer's (default: a temp dir)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=LENGTH, num_labels=2)
    model = BertForSequenceClassification(config)
    training = TrainingArguments(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="hf-bert-"),
        max_steps=args.max_steps, per_device_train_batch_size=args.batch,
        learning_rate=args.lr, seed=args.seed, logging_steps=10, save_strategy="no",
        report_to=[], disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=training,
                      train_dataset=Sequences(args.examples, args.seed))
    hf.train(trainer)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    print(f"done: {trainer.state.global_step} steps, "
          f"last loss {losses[-1] if losses else float('nan'):.4f}")


if __name__ == "__main__":
    main()
