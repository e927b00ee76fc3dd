"""Watching a remote trainer: CurveZMQ keys for both ends (see docs/remote.md).

Trainer side (environment of the training process, read when its publisher starts):
  LOADERTOP_CURVE_SECRET=path/to/trainer.key_secret   its own key pair (`loadertop keys`)
  LOADERTOP_AUTHORIZED_KEYS=dir/                      the public keys (*.key) of allowed viewers
The publisher socket becomes a CURVE server and a ZAP handler admits only those keys: an unknown
key or a plaintext viewer completes no handshake and receives nothing. Either variable without
the other, or a key file that does not load, is a configuration error: the trainer then publishes
nothing at all (one warning line) rather than fall back to plaintext.

Viewer side: `loadertop --key viewer.key_secret --server-key trainer.key tcp://HOST:PORT`
(`curve_client_options` turns the two files into the SUB socket's options).

Imports of zmq happen inside the functions: `loadertop.remote` stays cheap to import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from loadertop.environment import LOADERTOP_AUTHORIZED_KEYS, LOADERTOP_CURVE_SECRET

if TYPE_CHECKING:
    import zmq
    from zmq.auth.thread import ThreadAuthenticator

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"


class CurveConfigError(ValueError):
    """The trainer's CurveZMQ settings cannot be used; the message says what to fix."""


# ---------------------------------------------------------------------------- keys
def create_keys(directory: str | os.PathLike[str], name: str, *, force: bool = False) -> tuple[Path, Path]:
    """Write NAME.key (public, 0644) and NAME.key_secret (0600) in `directory` (made 0700 if
    new). The secret file is created under umask 077, so it is never readable by others, not even
    for the moment before a chmod (`zmq.auth.create_certificates` alone writes it 0644)."""
    import zmq.auth

    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"not a usable key name: {name!r}")
    directory = Path(directory).expanduser()
    public, secret = directory / f"{name}{PUBLIC_SUFFIX}", directory / f"{name}{SECRET_SUFFIX}"
    if not force:
        for path in (public, secret):
            if path.exists():
                raise FileExistsError(f"{path} exists (use --force to replace it, or --name)")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    old_umask = os.umask(0o077)
    try:
        for path in (public, secret):
            if force and path.exists():
                path.unlink()
        public_path, secret_path = zmq.auth.create_certificates(str(directory), name)
    finally:
        os.umask(old_umask)
    os.chmod(secret_path, 0o600)
    os.chmod(public_path, 0o644)
    return Path(public_path), Path(secret_path)


@overload
def _load(path: str | os.PathLike[str], *, need_secret: Literal[True],
          what: str) -> tuple[bytes, bytes]: ...
@overload
def _load(path: str | os.PathLike[str], *, need_secret: bool,
          what: str) -> tuple[bytes, bytes | None]: ...
def _load(path: str | os.PathLike[str], *, need_secret: bool, what: str) -> tuple[bytes, bytes | None]:
    import zmq.auth

    path = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(path):
        raise OSError(f"{what}: no such key file: {path}")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{what}: {path} is not a CurveZMQ key file ({exc})") from None
    if need_secret and not secret:
        raise ValueError(f"{what}: {path} holds no secret key (give the {SECRET_SUFFIX} file)")
    for key in (public, secret):
        if key is not None and len(key) != 40:
            raise ValueError(f"{what}: {path} holds a malformed key")
    return public, secret


# ---------------------------------------------------------------------------- viewer side
def curve_client_options(key_file: str | None,
                         server_key_file: str | None) -> dict[int, bytes]:
    """The SUB socket options of a CURVE client: this viewer's key pair and the trainer's
    public key. Raises ValueError / OSError with a one-line explanation."""
    import zmq

    if not key_file or not server_key_file:
        raise ValueError("--key (this viewer's .key_secret file) and --server-key (the "
                         "trainer's public .key file) go together")
    public, secret = _load(key_file, need_secret=True, what="--key")
    server_public, _ = _load(server_key_file, need_secret=False, what="--server-key")
    return {
        zmq.CURVE_PUBLICKEY: public,
        zmq.CURVE_SECRETKEY: secret,
        zmq.CURVE_SERVERKEY: server_public,
    }


# ---------------------------------------------------------------------------- trainer side
@dataclass(frozen=True)
class CurveServer:
    public: bytes
    secret: bytes
    authorized_dir: str
    authorized: int  # how many viewer keys the directory held at start


def curve_server_from_env(environ: Mapping[str, str] = os.environ) -> CurveServer | None:
    """The trainer's CURVE settings from the environment; None when neither variable is set.

    Called on the training thread before the publisher thread starts: it also imports
    `zmq.auth.thread` (asyncio included) there, since a module import on the publisher thread
    could deadlock a DataLoader worker forked meanwhile.
    """
    secret_file = environ.get(LOADERTOP_CURVE_SECRET, "").strip()
    keys_dir = environ.get(LOADERTOP_AUTHORIZED_KEYS, "").strip()
    if not secret_file and not keys_dir:
        return None
    if not secret_file or not keys_dir:
        missing = LOADERTOP_CURVE_SECRET if not secret_file else LOADERTOP_AUTHORIZED_KEYS
        raise CurveConfigError(f"CurveZMQ needs both {LOADERTOP_CURVE_SECRET} and "
                               f"{LOADERTOP_AUTHORIZED_KEYS}; {missing} is not set, so nothing is published")
    import zmq.auth
    import zmq.auth.thread

    try:
        public, secret = _load(secret_file, need_secret=True, what=LOADERTOP_CURVE_SECRET)
    except (OSError, ValueError) as exc:
        raise CurveConfigError(f"{exc}; nothing is published") from None
    keys_dir = os.path.expanduser(keys_dir)
    if not os.path.isdir(keys_dir):
        raise CurveConfigError(f"{LOADERTOP_AUTHORIZED_KEYS}: no such directory: {keys_dir}; "
                               f"nothing is published")
    try:
        authorized = len(zmq.auth.load_certificates(keys_dir))
    except (OSError, ValueError) as exc:
        raise CurveConfigError(f"{LOADERTOP_AUTHORIZED_KEYS}: {exc}; nothing is published") from None

    return CurveServer(public=public, secret=secret, authorized_dir=keys_dir, authorized=authorized)


def start_curve_server(ctx: zmq.Context[Any], sock: zmq.Socket[Any],
                       curve: CurveServer) -> ThreadAuthenticator:
    """Make `sock` (not yet bound) a CURVE server admitting only the authorised keys; returns the
    started authenticator (stop it before terminating `ctx`). Runs on the publisher thread."""
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(ctx)
    auth.start()
    # Keys are read now: a viewer key added later needs a trainer restart.
    auth.configure_curve(domain="*", location=curve.authorized_dir)
    sock.curve_secretkey = curve.secret
    sock.curve_publickey = curve.public
    sock.curve_server = True
    return auth
