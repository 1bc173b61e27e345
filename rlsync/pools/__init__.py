"""`python -m rlsync.pools join|list|leave` (`__main__.py`): a command line at the top, like `rlsync/train.py`.

Only the CLI lives here; the pools themselves (PoolSet, policies, churn, the job file) are the library room
`rlsync/pool/`, which imports nothing above it (no run config): this package may, being an entry point.
"""
