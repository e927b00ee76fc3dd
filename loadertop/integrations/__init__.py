"""Loader figures where people already look (docs/trackers.md, docs/contract.md §11).

`metrics` is `loadertop.metrics()` and `loadertop.verdict()`: this process's loaders, read by the
viewers' own client code in-process. `lightning` and `transformers` are the frameworks' callbacks;
each imports its framework only when used, so loadertop installs and imports without them.
"""
