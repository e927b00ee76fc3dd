"""One module per bottleneck category (docs/contract.md §4): its rule (`judge`), its place in the
order of urgency (`RANK`), its words (verdict and advice) and its colour. `registry` collects them;
see its docstring for how to add one."""
