"""The code `loadertop attach` runs inside the target, at a safe point of its main thread.

`inject` writes this file's source, after a line `PARAMS = {...}`, into the private discovery
directory, and has the target execute it in a namespace of its own (nothing is added to the
target's `__main__`). It uses only the stdlib and runs on the target's Python (3.10+ syntax), so
it can say what is wrong before anything of loadertop is imported there:

1. it claims its own file by deleting it: `attach` deletes the file instead when it gives up
   waiting, so exactly one of the two wins, and a late run after a timeout does nothing;
2. checks the interpreter, torch's DataLoader module, "already attached" / "instrumented";
3. finds loadertop on the target's own sys.path (`find_spec` imports nothing), then imports
   `loadertop.probe.attach` from there — never from the attaching side's path, so no module the
   target has imported is shadowed, and the compiled dependencies are the target's own;
4. calls `attach()` / `detach()` there, and on any failure undoes what was done;
5. writes its result (JSON) next to where its file was; attach waits for that file.

It never raises: an exception escaping a pending call would surface as a SystemError in the
training loop (and a SystemExit would end the process). A Ctrl-C that lands while it runs is
re-delivered to the main thread afterwards.
"""

# No `from __future__` import here: `inject` puts the PARAMS lines before this source.

# The statement the target's PyRun_SimpleString runs (`inject` fills in the path). It binds no
# name in `__main__` and swallows everything: a missing file means attach cancelled it.
STATEMENT = """\
try:
    __import__('builtins').exec(__import__('builtins').compile(__import__('builtins').open({path!r}, \
'rb').read(), {path!r}, 'exec'), {{'__name__': '__loadertop_attach__', '__builtins__': \
__import__('builtins')}})
except BaseException:
    pass
"""

DATALOADER_MODULE = "torch.utils.data.dataloader"


def _main(params: dict) -> None:
    import os
    import time

    started = time.perf_counter()
    try:
        os.unlink(params["script"])  # the claim (see above)
    except OSError:
        return
    # The garbage collector stays as it is. Paused while loadertop was imported, the pause was
    # shorter, but the import's objects then left the job just under its next full collection,
    # and every DataLoader worker it forked made that collection itself: a job making 2-worker
    # loaders again and again paid it in many of them (docs/performance.md). Left on, the full
    # collection the import may trigger happens here, once, and the job's counts start afresh.
    interrupted = False
    try:
        result = _run(params)
    except KeyboardInterrupt:
        interrupted = True
        result = _error("failed", "interrupted by Ctrl-C while attaching; nothing was changed")
    except BaseException as exc:  # noqa: B036 - nothing may escape into the training loop
        result = _error("failed", f"{type(exc).__name__}: {exc}")
    try:
        import sys

        result.update(python=sys.version.split()[0], executable=sys.executable, prefix=sys.prefix,
                      pause_ms=round((time.perf_counter() - started) * 1000, 1))
        _write(params["result"], result)
    except BaseException:  # noqa: B036
        pass
    if interrupted:
        import _thread

        _thread.interrupt_main()  # the program's own Ctrl-C, raised in its code right after this


def _error(kind: str, message: str, **extra) -> dict:
    return dict(ok=False, error=kind, message=message, **extra)


def _run(params: dict) -> dict:
    import os
    import sys

    pid = os.getpid()
    if sys.implementation.name != "cpython" or sys.version_info < (3, 10):
        return _error("not_python", f"pid {pid} runs {sys.implementation.name} "
                                    f"{sys.version.split()[0]}; loadertop attach needs CPython 3.10+")
    existing = sys.modules.get("loadertop.probe.attach")
    if params["mode"] == "detach":
        if existing is None or not existing.attached():
            return _error("not_attached", f"loadertop attach is not attached to pid {pid}")
        return existing.detach()
    if DATALOADER_MODULE not in sys.modules:
        return _error("no_torch", f"pid {pid} never imported torch's DataLoader "
                                  f"({DATALOADER_MODULE}): there is no loader to watch")
    if existing is not None and existing.attached():
        return _error("already", f"loadertop is already attached to pid {pid} (undo with "
                                 f"`loadertop attach --detach {pid}`)")
    publisher = sys.modules.get("loadertop.probe.publisher")
    running = getattr(publisher, "_publisher", None) if publisher is not None else None
    if running is not None and getattr(running, "pid", None) == pid:
        return _error("already", f"pid {pid} is already instrumented by loadertop (`loadertop run` "
                                 f"or loadertop.instrument): watch it with `loadertop`")
    install = _install_hint(params)
    import importlib.util

    if importlib.util.find_spec("loadertop") is None:
        return _error("no_loadertop", f"loadertop is not installed in the Python of pid {pid} "
                                      f"({sys.executable}); {install}")
    before = set(sys.modules)
    try:
        from loadertop.probe import attach as probe
    except ImportError as exc:
        _forget_new_modules(before)
        name = getattr(exc, "name", None) or str(exc)
        missing = "loadertop there has no attach support" if str(name).startswith("loadertop") \
            else f"loadertop there cannot import {name}"
        return _error("no_loadertop", f"{missing} (Python of pid {pid}: {sys.executable}); {install}")
    if getattr(probe, "PROTOCOL", None) != params["protocol"]:
        _forget_new_modules(before)
        return _error("no_loadertop", f"loadertop in the Python of pid {pid} ({sys.executable}) "
                                      f"speaks attach protocol {getattr(probe, 'PROTOCOL', None)}, "
                                      f"this one {params['protocol']}; {install}")
    try:
        return probe.attach(endpoint=params.get("endpoint"), directory=params["directory"])
    except BaseException as exc:  # noqa: B036
        try:
            probe.detach(quiet=True)
        except BaseException:  # noqa: B036
            pass
        _forget_new_modules(before)
        if isinstance(exc, KeyboardInterrupt):
            raise
        return _error("failed", f"attaching failed in pid {pid}, which was put back as it was: "
                                f"{type(exc).__name__}: {exc}")


def _install_hint(params: dict) -> str:
    import sys

    return (f"install it into that environment: {sys.executable} -m pip install "
            f"'loadertop=={params['version']}'")


def _forget_new_modules(before: set) -> None:
    """After a failed import: the loadertop modules it left half-imported are dropped, so a later
    attach (after installing what was missing) imports them afresh. Third-party modules that did
    import (zmq, psutil, msgspec) stay: removing an extension module is not undoing it."""
    import sys

    for name in set(sys.modules) - before:
        if name == "loadertop" or name.startswith("loadertop."):
            sys.modules.pop(name, None)


def _write(path: str, result: dict) -> None:
    import json
    import os

    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(result, fh)
    os.replace(tmp, path)


if __name__ == "__loadertop_attach__":
    _main(globals()["PARAMS"])
