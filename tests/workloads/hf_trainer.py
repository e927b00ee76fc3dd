"""A Hugging Face `Trainer` fine-tuning a tiny BERT built from a config (no download), its loaders
made by the Trainer through accelerate, with workers.

    python tests/workloads/hf_trainer.py OUTPUT_DIR [--steps N] [--stop FILE] [--report-to tensorboard]
                                         [--callback] [--logging-steps K] [--eval-steps K]

Trains `--steps` steps of batch 8 (a sample sleeps `--sample-ms`, an I/O-like read), evaluating
every `--eval-steps`; with `--stop FILE`, up to 10000 steps, ending at the first step after FILE
exists (60 s cap). `--callback` adds `loadertop.integrations.transformers.LoadertopCallback`.
Prints `done <global step>` at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: the model is made here
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

BATCH = 8


class Tokens(Dataset):
    """Sequences of 16 token ids and a label, after `sample_ms` of sleep."""

    def __init__(self, n: int, sample_ms: float) -> None:
        g = torch.Generator().manual_seed(n)
        self.ids = torch.randint(0, 100, (n, 16), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        self.sample_s = sample_ms / 1000.0

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        if self.sample_s:
            time.sleep(self.sample_s)
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class StopWhenTold(TrainerCallback):
    def __init__(self, path: str) -> None:
        self.path = path
        self.deadline = time.monotonic() + 60

    def on_step_end(self, args, state, control, **kwargs):
        if os.path.exists(self.path) or time.monotonic() > self.deadline:
            control.should_training_stop = True
        return control


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--stop", default=None)
    parser.add_argument("--report-to", default="none")
    parser.add_argument("--callback", action="store_true")
    parser.add_argument("--logging-steps", type=int, default=2)
    parser.add_argument("--eval-steps", type=int, default=5)
    parser.add_argument("--sample-ms", type=float, default=2.0)
    args = parser.parse_args(argv)
    config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    training = TrainingArguments(
        output_dir=args.output_dir, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH, max_steps=10000 if args.stop else args.steps,
        dataloader_num_workers=2, report_to=args.report_to, logging_steps=args.logging_steps,
        eval_strategy="steps",
        eval_steps=args.eval_steps, use_cpu=True, save_strategy="no", disable_tqdm=True)
    callbacks: list = [StopWhenTold(args.stop)] if args.stop else []
    if args.callback:
        from loadertop.integrations.transformers import LoadertopCallback

        callbacks.append(LoadertopCallback())
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(4096, args.sample_ms),
                      eval_dataset=Tokens(16, args.sample_ms), callbacks=callbacks)
    trainer.train()
    print(f"done {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
