"""Bundled example jobs (shipped in the wheel so `loadertop demo` works after `pip install`)."""
