"""A Lightning `Trainer` fitting a small regression, its loaders made by the module's own
`train_dataloader()` / `val_dataloader()` hooks, with workers.

    python tests/workloads/lightning_fit.py OUTPUT_DIR [--steps N] [--stop FILE]
                                            [--loggers tensorboard,csv] [--callback]
                                            [--log-every K]

Fits `--steps` training batches of 16 (an epoch is 8 of them, then 2 validation batches); a sample
sleeps `--sample-ms` (an I/O-like read). With `--stop FILE`, up to 1000 epochs, ending at the first
batch after FILE exists (60 s cap). `--callback` adds
`loadertop.integrations.lightning.LoadertopCallback`; `--quiet`: the module logs nothing itself;
`--logs DIR`: the loggers write there. Prints `done <global step>` at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

warnings.filterwarnings("ignore")  # Lightning's advice on workers and loggers: not under test
os.environ.setdefault("LITLOGGER_DISABLED", "1")

import lightning as L  # noqa: E402

BATCH = 16
EPOCH_BATCHES = 8


class Points(Dataset):
    def __init__(self, n: int, sample_ms: float) -> None:
        g = torch.Generator().manual_seed(n)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.sample_s = sample_ms / 1000.0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.sample_s:
            time.sleep(self.sample_s)
        return self.x[i], self.y[i]


class Regression(L.LightningModule):
    def __init__(self, sample_ms: float) -> None:
        super().__init__()
        self.net = nn.Linear(8, 1)
        self.sample_ms = sample_ms
        self.quiet = False  # --quiet: the module logs nothing itself

    def training_step(self, batch, index):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        if not self.quiet:
            self.log("loss", loss)
        return loss

    def validation_step(self, batch, index):
        x, y = batch
        if not self.quiet:
            self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(Points(BATCH * EPOCH_BATCHES * 4, self.sample_ms), batch_size=BATCH,
                          num_workers=2, shuffle=True)

    def val_dataloader(self):
        return DataLoader(Points(BATCH * 2, self.sample_ms), batch_size=BATCH, num_workers=2)


class StopWhenTold(L.Callback):
    def __init__(self, path: str) -> None:
        self.path = path
        self.deadline = time.monotonic() + 60

    def on_train_batch_end(self, trainer, *args) -> None:
        if os.path.exists(self.path) or time.monotonic() > self.deadline:
            trainer.should_stop = True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--stop", default=None)
    parser.add_argument("--loggers", default="")
    parser.add_argument("--callback", action="store_true")
    parser.add_argument("--log-every", type=int, default=2)
    parser.add_argument("--sample-ms", type=float, default=1.0)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--logs", default=None, help="the loggers' directory (default OUTPUT_DIR)")
    args = parser.parse_args(argv)
    loggers: list = []
    logs = args.logs or args.output_dir
    for name in filter(None, args.loggers.split(",")):
        if name == "tensorboard":
            loggers.append(L.pytorch.loggers.TensorBoardLogger(logs, name="tb"))
        elif name == "csv":
            loggers.append(L.pytorch.loggers.CSVLogger(logs, name="csv"))
        else:
            raise SystemExit(f"unknown logger {name}")
    callbacks: list = [StopWhenTold(args.stop)] if args.stop else []
    if args.callback:
        from loadertop.integrations.lightning import LoadertopCallback

        callbacks.append(LoadertopCallback())
    epochs = 1000 if args.stop else -(-args.steps // EPOCH_BATCHES)
    trainer = L.Trainer(
        max_epochs=epochs, max_steps=-1 if args.stop else args.steps,
        limit_train_batches=EPOCH_BATCHES, limit_val_batches=2, log_every_n_steps=args.log_every,
        logger=loggers or False, callbacks=callbacks, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
        default_root_dir=args.output_dir)
    torch.manual_seed(0)
    module = Regression(args.sample_ms)
    module.quiet = args.quiet
    trainer.fit(module)
    print(f"done {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
