"""The synthetic training job behind `loadertop demo`, runnable on its own.

    python examples/demo_train.py --phase-seconds 20     # then, in another terminal: loadertop

The job itself lives in the package (`loadertop/examples/demo_train.py`) so that `loadertop demo`
works from an installed wheel; read that file for how it is instrumented and what each phase does.
"""

import sys

from loadertop.examples.demo_train import main

if __name__ == "__main__":
    sys.exit(main())
