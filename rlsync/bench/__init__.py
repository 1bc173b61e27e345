"""Benchmarks: `python -m rlsync.bench SCENARIO`. Figures are ratios measured in one run."""
