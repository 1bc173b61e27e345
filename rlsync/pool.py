"""`python -m rlsync.pool ...`: the old name of `python -m rlsync.pools` (attach pools to a running job), kept working."""

from rlsync.pools.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main())
