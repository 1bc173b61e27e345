"""rlsync.telemetry: the recording layer — step metrics, where fetched bytes came from, trace, loggers, progress.

    metrics.py       StepAggregator: a step window of stall records -> `stall/*`, `sync/*`
    sync_sources.py  SourceLedger: which source (trainer, peer, seed) served each fetched byte, DC crossings
    trace.py         TraceWriter: Chrome/Perfetto trace of every worker's states
    loggers.py       JSONL and wandb sinks (NullLogger when off)
    progress.py      the console's live step line
    completions.py   a few decoded completions per step (RUN_DIR/completions.jsonl, a wandb table)
    report.py        a run's plots on one HTML page (its CLI: `python -m rlsync.report`)

It imports only `rlsync.core.stall` and itself (tests/telemetry/test_layering.py).
"""
