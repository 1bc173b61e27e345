"""Where step metrics go: JSONL beside the run (always), wandb (offline unless configured), or nowhere.

    logger = make_logger(LoggingConfig(run_dir="runs/r1"))   # JSONL + wandb offline
    logger.log({"stall/total_s": 1.5, "reward/mean": 0.3}, step=7)
    logger.log_rows("completions", [{"prompt": "2+2", "response": "4", "reward": 1.0}], step=7)
    logger.close()

Every backend implements `MetricLogger` (`log`, `log_rows(table, rows, step)`, `close`): a table's rows go
to `RUN_DIR/<table>.jsonl` and a wandb table; callers never ask which backends are on. The JSONL is the
run's readable record (wandb 0.31 offline runs are binary; `python -m rlsync.report` reads the JSONL).

The stall dashboard is defined here as data (`STALL_DASHBOARD`). A wandb run (offline too) gets
`define_metric` summaries and the dashboard spec in `RUN_DIR/wandb_dashboard.json`; workspace panels
live on the wandb server, so `apply_wandb_dashboard()` creates them with `wandb-workspaces` once the
run is synced (docs/telemetry.md shows the commands).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from rlsync.telemetry.metrics import STALL_CAUSE_KEYS

__all__ = [
    "MetricLogger",
    "NullLogger",
    "JsonlLogger",
    "WandbLogger",
    "MultiLogger",
    "LoggingConfig",
    "make_logger",
    "Panel",
    "Section",
    "STALL_DASHBOARD",
    "apply_wandb_dashboard",
    "dashboard_spec",
    "read_jsonl",
    "RUN_CONFIG_FILE",
]

log = logging.getLogger(__name__)


@runtime_checkable
class MetricLogger(Protocol):
    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record one step's scalar metrics."""

    def log_rows(self, table: str, rows: Sequence[Mapping[str, Any]], step: int) -> None:
        """Record one step's rows of table `table` (e.g. a sample of completions); no rows: nothing."""

    def close(self) -> None:
        """Flush and release; idempotent."""


class NullLogger:
    """Accepts everything, records nothing: the logger of a backend that is off."""

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        pass

    def log_rows(self, table: str, rows: Sequence[Mapping[str, Any]], step: int) -> None:
        pass

    def close(self) -> None:
        pass


def _scalar(v: Any) -> Any:
    """Plain JSON value: numpy/torch scalars via .item(), NaN/inf as null (strict JSON has neither)."""
    if hasattr(v, "item") and callable(v.item):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return str(v)


def _plain(v: Any) -> Any:
    """A JSON value: lists and dicts kept (their items made plain), scalars as `_scalar` makes them."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return _scalar(v)


def _cell(v: Any) -> Any:
    """A table cell: a plain scalar, or a list/dict as compact JSON text (one type per column for wandb)."""
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(_plain(v), separators=(",", ":"))
    return _scalar(v)


class JsonlLogger:
    """One JSON object per line in `RUN_DIR/metrics.jsonl`: `{"step": 7, "time": <unix s>, ...}`; a table's
    rows in `RUN_DIR/<table>.jsonl`, each `{"step": 7, ...the row}`.

    Each line is flushed as written, so a crashed run keeps every step it logged. Appends, so a
    resumed run continues the same file. `keep_through_step` (a resumed run: its checkpoint's step)
    first drops the rows of later steps, which the resumed run trains and logs again: the file is
    rewritten atomically (write + rename), so each step is there once and a crash mid-rewrite loses
    nothing. `JsonlLogger(run_dir, keep_through_step=300)` over steps 1..309 keeps 1..300; it then
    takes rows of steps after 300 only (those through 300 are the earlier part's, e.g. its evals).
    """

    def __init__(self, run_dir: str | os.PathLike, filename: str = "metrics.jsonl", *,
                 keep_through_step: int | None = None) -> None:
        self.path = Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.keep_through_step = keep_through_step
        if keep_through_step is not None and self.path.exists():
            self._truncate_after(keep_through_step)
        self._f = open(self.path, "a", encoding="utf-8")
        self._tables: dict[str, Any] = {}

    def _truncate_after(self, step: int) -> None:
        rows = read_jsonl(self.path)
        kept = [r for r in rows if not isinstance(r.get("step"), int) or r["step"] <= step]
        if len(kept) < len(rows):
            log.info("%s: %d rows after step %d dropped (trained again by the resumed run)",
                     self.path, len(rows) - len(kept), step)
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in kept), encoding="utf-8")
        os.replace(tmp, self.path)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self.keep_through_step is not None and step <= self.keep_through_step:
            return  # recorded by the part before the resume
        row = {"step": int(step), "time": time.time()}
        row.update({str(k): _scalar(v) for k, v in metrics.items()})
        self._f.write(json.dumps(row, allow_nan=False) + "\n")
        self._f.flush()

    def log_rows(self, table: str, rows: Sequence[Mapping[str, Any]], step: int) -> None:
        if not rows:
            return
        if table not in self._tables:
            self._tables[table] = open(self.path.parent / f"{table}.jsonl", "a", encoding="utf-8")
        f = self._tables[table]
        for r in rows:
            row = {"step": int(step), **{str(k): _plain(v) for k, v in r.items()}}
            f.write(json.dumps(row, allow_nan=False) + "\n")
        f.flush()

    def close(self) -> None:
        for f in (self._f, *self._tables.values()):
            if not f.closed:
                f.close()


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a metrics JSONL; a torn last line (crash mid-write) is skipped."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("skipping unreadable line in %s: %.80s", path, line)
    return rows


# --- the stall dashboard, as data --------------------------------------------------------------


@dataclass(frozen=True)
class Panel:
    title: str
    keys: tuple[str, ...]
    """Metric keys; globs (`pool/*/workers`) expand against the run's keys when applied."""
    style: str = "line"
    """`line` or `stacked-area` (wandb LinePlot plot_type)."""


@dataclass(frozen=True)
class Section:
    name: str
    panels: tuple[Panel, ...]


STALL_DASHBOARD: tuple[Section, ...] = (
    Section("Stall", (
        Panel("Stall per step by cause (worker-s)", STALL_CAUSE_KEYS, style="stacked-area"),
        Panel("Idle ratio per side", ("stall/rollout_idle_ratio", "stall/trainer_idle_ratio")),
        Panel("Total stall (worker-s)", ("stall/total_s",)),
    )),
    Section("Sync", (
        Panel("Sync GB/s", ("sync/gbps",)),
        Panel("Sync bytes and seconds", ("sync/bytes", "sync/seconds")),
        Panel("Hub", ("hub/replicas", "hub/retained_versions")),
    )),
    Section("Pools", (
        Panel("Workers per pool", ("pool/*/workers",), style="stacked-area"),
        Panel("Idle ratio per pool", ("pool/*/idle_ratio",)),
    )),
)

_SUMMARIES = {"stall/*": "mean", "sync/gbps": "mean", "reward/*": "max"}
"""`define_metric` summaries: what the run table shows for each family."""


def dashboard_spec(sections: Sequence[Section] = STALL_DASHBOARD) -> list[dict[str, Any]]:
    return [asdict(s) for s in sections]


def _expand(keys: Sequence[str], known: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    for k in keys:
        if any(c in k for c in "*?[") and known is not None:
            out.extend(sorted(x for x in known if fnmatch.fnmatchcase(x, k)))
        else:
            out.append(k)
    return out


def apply_wandb_dashboard(
    entity: str,
    project: str,
    *,
    known_keys: Sequence[str] | None = None,
    name: str = "rlsync stall",
    sections: Sequence[Section] = STALL_DASHBOARD,
    save: bool = True,
) -> Any:
    """Create the stall workspace on the wandb server (needs `pip install wandb-workspaces`, a login).

    `known_keys` (e.g. the keys of `metrics.jsonl`) expand the glob panels. Returns the workspace
    object (not saved when `save=False`).
    """
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError as e:
        raise ImportError(
            "applying the dashboard needs the wandb-workspaces package: pip install wandb-workspaces"
        ) from e
    workspace = ws.Workspace(
        name=name,
        entity=entity,
        project=project,
        sections=[
            ws.Section(
                name=s.name,
                is_open=True,
                panels=[
                    wr.LinePlot(title=p.title, y=_expand(p.keys, known_keys), plot_type=p.style)
                    for p in s.panels
                ],
            )
            for s in sections
        ],
    )
    if save:
        workspace.save()
    return workspace


# --- wandb ---------------------------------------------------------------------------------------


class WandbLogger:
    """A wandb run; offline unless `mode`/`WANDB_MODE` says otherwise. Files land in RUN_DIR/wandb."""

    @dataclass(kw_only=True)
    class Config:
        enabled: bool = True
        """Off: make_logger uses a NullLogger in wandb's place."""
        project: str = "rlsync"
        """wandb project."""
        entity: str | None = None
        """wandb entity (team/user); None: the logged-in default."""
        mode: str | None = None
        """`offline`, `online` or `disabled`; None: $WANDB_MODE, else offline."""
        name: str | None = None
        """Run name; None: wandb's generated name."""
        group: str | None = None
        """Run group (e.g. the recipe)."""
        tags: list[str] = field(default_factory=list)
        """Run tags."""

    RUN_ID_FILE = "wandb_run_id"
    """In the run dir: the wandb run's id, so that a resumed run (`resume=auto`) logs to the same wandb run."""

    def __init__(self, config: "WandbLogger.Config", run_dir: str | os.PathLike,
                 run_config: Mapping[str, Any] | None = None, *, resume: bool = False) -> None:
        import wandb  # imported here: a run without wandb never pays its import

        self.mode = config.mode or os.environ.get("WANDB_MODE") or "offline"
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        id_file = run_dir / self.RUN_ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.exists() else None
        if run_id is None:
            run_id = secrets.token_hex(4)  # wandb's own form: 8 lowercase alphanumerics
            id_file.write_text(run_id)
        self.run = wandb.init(
            id=run_id,
            resume="allow",
            project=config.project,
            entity=config.entity,
            name=config.name,
            group=config.group,
            tags=list(config.tags) or None,
            mode=self.mode,
            dir=str(run_dir),
            config=dict(run_config or {}),
        )
        for pattern, summary in _SUMMARIES.items():
            self.run.define_metric(pattern, summary=summary)
        (run_dir / "wandb_dashboard.json").write_text(json.dumps(dashboard_spec(), indent=1))
        self._closed = False

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log({k: _scalar(v) for k, v in metrics.items()}, step=int(step))

    def log_rows(self, table: str, rows: Sequence[Mapping[str, Any]], step: int) -> None:
        """A `wandb.Table` named `table` at `step` (columns: step, then the rows' keys in first-seen order)."""
        if not rows:
            return
        import wandb

        cols = ["step", *dict.fromkeys(k for r in rows for k in r)]
        data = [[int(step), *(_cell(r.get(c)) for c in cols[1:])] for r in rows]
        self.run.log({table: wandb.Table(columns=cols, data=data)}, step=int(step))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.run.finish()


class MultiLogger:
    """Sends every call to each logger; NullLoggers are dropped."""

    def __init__(self, loggers: Sequence[MetricLogger]) -> None:
        self.loggers = [lg for lg in loggers if not isinstance(lg, NullLogger)]

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for lg in self.loggers:
            lg.log(metrics, step)

    def log_rows(self, table: str, rows: Sequence[Mapping[str, Any]], step: int) -> None:
        for lg in self.loggers:
            lg.log_rows(table, rows, step)

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()


@dataclass(kw_only=True)
class LoggingConfig:
    run_dir: str = "."
    """Directory of the run: metrics.jsonl, trace.json, wandb/ and report/ go here."""
    jsonl: bool = True
    """Write RUN_DIR/metrics.jsonl (python -m rlsync.report reads it)."""
    wandb: WandbLogger.Config = field(default_factory=WandbLogger.Config)
    """wandb backend; offline by default."""
    completions_per_step: int = field(default=4, metadata={"ge": 0})
    """Sampled completions (prompt, response, reward, version) kept per step in RUN_DIR/completions.jsonl and
    the wandb table `completions`; each rollout call decodes at most this many. 0: none (docs/telemetry.md)."""


RUN_CONFIG_FILE = "config.json"
"""In the run dir: the run's resolved config as JSON (the local copy of wandb's run config; what
`python -m rlsync.export` rebuilds the model from). Rewritten by each invocation, a resumed one too."""


def make_logger(cfg: LoggingConfig | Mapping[str, Any], run_config: Mapping[str, Any] | None = None, *,
                resume_step: int | None = None) -> MetricLogger:
    """The run's logger from its config (a `LoggingConfig` or a mapping of the same fields); `resume_step`: a run
    continued from the checkpoint of that step, which keeps the JSONL's rows through it (later ones are trained
    again) and logs to the same wandb run as before. None: a fresh run."""
    if not isinstance(cfg, LoggingConfig):
        cfg = dict(cfg)
        wb = cfg.pop("wandb", {}) or {}
        cfg = LoggingConfig(**cfg, wandb=wb if isinstance(wb, WandbLogger.Config) else WandbLogger.Config(**dict(wb)))
    if run_config is not None:
        path = Path(cfg.run_dir) / RUN_CONFIG_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(dict(run_config), indent=1, default=str))
        os.replace(tmp, path)  # a reader never sees half a file
    mode = cfg.wandb.mode or os.environ.get("WANDB_MODE") or "offline"
    loggers: list[MetricLogger] = [JsonlLogger(cfg.run_dir, keep_through_step=resume_step) if cfg.jsonl
                                   else NullLogger()]
    if cfg.wandb.enabled and mode != "disabled":
        loggers.append(WandbLogger(cfg.wandb, cfg.run_dir, run_config, resume=resume_step is not None))
    return MultiLogger(loggers)
