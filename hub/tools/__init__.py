"""Worker processes driven over a pipe and the demo: used by tests, benchmarks and `python -m rlsync.hub demo`."""
