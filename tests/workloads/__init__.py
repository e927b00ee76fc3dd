"""Small, parameterised training workloads for the end-to-end tests (see train.py)."""
