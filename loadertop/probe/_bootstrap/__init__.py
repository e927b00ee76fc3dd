"""`loadertop run` puts this directory first on the child's PYTHONPATH; see sitecustomize.py.
(This file only makes the directory a package, so it ships inside the wheel.)"""
