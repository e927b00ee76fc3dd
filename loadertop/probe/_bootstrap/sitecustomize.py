"""The startup hook of `loadertop run` (this directory is first on the child's PYTHONPATH).

Python imports the first `sitecustomize` on sys.path at startup, so this one:
1. with LOADERTOP_RUN=1 only, installs the DataLoader patch (`loadertop.probe.autoinstrument`;
   it does not import torch — it waits for torch's dataloader module to be imported);
2. always runs the `sitecustomize` this one hides (the next one on sys.path: a distribution's,
   a virtualenv's, the user's own), exactly as Python would have, errors reported the same way.
Anything that goes wrong here prints one line and leaves the program to run uninstrumented.
"""

import os
import sys


def _loadertop_run_hook():
    # The names are literals (the same as loadertop.environment's, which a unit test checks), not
    # imported: this file runs at the start of every Python below `loadertop run` — other
    # virtualenvs, system tools — which may not have loadertop at all, and which should pay for no
    # import unless LOADERTOP_RUN says this job is being instrumented.
    if os.environ.get("LOADERTOP_RUN") != "1":
        return
    try:
        from loadertop.probe import autoinstrument
    except Exception as exc:
        # A Python without loadertop (another virtualenv): say so once for the whole job.
        if not os.environ.get("LOADERTOP_RUN_WARNED"):
            os.environ["LOADERTOP_RUN_WARNED"] = "1"
            print(f"loadertop run: {sys.executable} cannot import loadertop ({exc}); its "
                  f"DataLoaders are not instrumented. Install loadertop into that environment.",
                  file=sys.stderr, flush=True)
        return
    try:
        autoinstrument.apply_rank_port(os.environ)
        autoinstrument.install()
    except Exception as exc:
        print(f"loadertop run: DataLoaders are not instrumented: {exc!r}", file=sys.stderr,
              flush=True)


def _chain_hidden_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))

    def same_dir(entry):
        try:
            return os.path.samefile(entry or os.curdir, here)
        except OSError:
            return False

    import importlib.machinery
    import importlib.util

    rest = [entry for entry in sys.path if not same_dir(entry)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    ours = sys.modules.get("sitecustomize")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        # What site.py does when a sitecustomize raises: report, and carry on.
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)


_loadertop_run_hook()
_chain_hidden_sitecustomize()
del _loadertop_run_hook, _chain_hidden_sitecustomize
