"""`loadertop tune`: find the num_workers a program's main DataLoader needs, by running it.

- `strategy` — pure: given the trials so far, the next count to try or why to stop, and the pick;
- `trial` — one trial: the program under `loadertop run`'s start-up hook with num_workers
  overridden, measured through the shim and the viewer's `Model`, then ended (process group);
- `session` — the trials one after another, Ctrl-C, and the `loadertop.tune/1` document;
- `recommendation` — the one sentence the run ends with, and its reason;
- `document` — the document's typed Structs; `output` — progress lines, table, plot.

No textual here; torch only ever in the program being tuned.
"""
