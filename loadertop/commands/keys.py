"""`loadertop keys [DIR] [--name NAME] [--force]`: create a CurveZMQ key pair and say how to use it."""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from pathlib import Path


def default_dir() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "loadertop" / "keys"


def default_name() -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname().split(".")[0]).strip(".-")
    return name or "loadertop"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loadertop keys",
        description="Create a CurveZMQ key pair (NAME.key public, NAME.key_secret private, mode "
                    "0600) for watching a trainer over the network; see docs/remote.md.")
    p.add_argument("directory", nargs="?", default=None, metavar="DIR",
                   help=f"where to write the pair (default {default_dir()})")
    p.add_argument("--name", default=None,
                   help=f"file name of the pair (default: this host's name, {default_name()})")
    p.add_argument("--force", action="store_true", help="replace an existing pair of that name")
    return p


def main(argv: list[str]) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from loadertop import remote

    directory = Path(args.directory).expanduser() if args.directory else default_dir()
    name = args.name or default_name()
    try:
        public, secret = remote.create_keys(directory, name, force=args.force)
    except (OSError, ValueError) as exc:
        print(f"loadertop keys: {exc}", file=sys.stderr)
        return 1
    print(f"""\
created the CurveZMQ key pair "{name}":
  public key  {public}  (give it to the other side)
  secret key  {secret}  (mode 0600: it never leaves this machine)

Each side has its own pair (run `loadertop keys` on both machines); each gives the other its .key.
On the trainer: put the viewers' public keys in a directory, then start training with
  LOADERTOP_CURVE_SECRET=.../TRAINER.key_secret LOADERTOP_AUTHORIZED_KEYS=.../authorized/ \\
    loadertop run --listen tcp://0.0.0.0:5555 -- python train.py
On the viewer:
  loadertop --key .../VIEWER.key_secret --server-key .../TRAINER.key tcp://TRAINER-HOST:5555
A viewer whose key is not in the trainer's directory, or without keys, receives nothing.""")
    return 0
