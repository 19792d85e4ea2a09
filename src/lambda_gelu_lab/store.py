"""Results in one SQLite file: a row per finished run, written in one transaction with its curves.

A run is keyed by (task, arm, seed, run_hash). Nothing is written until a run has finished, and then
everything about it is written at once, so a sweep killed at any moment loses only the run that was
in flight, and a rerun skips every run already stored. Several processes may share a store: each
run's weights go to a file of its own (a unique name, written under a temporary name and renamed),
and its row is inserted only if no other process stored the run first — so a row always points to
the weights of the run it describes, and a weights file without a row is an orphan, never a lie.

The store owns every table, the deployment results included; use it as a context manager.
"""
from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from .config import ConfigError, RunConfig

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    task TEXT NOT NULL, arm TEXT NOT NULL, seed INTEGER NOT NULL, run_hash TEXT NOT NULL,
    base_hash TEXT NOT NULL, variant TEXT NOT NULL,
    config TEXT NOT NULL,                 -- the full RunConfig as JSON
    metrics TEXT NOT NULL,                -- everything train_run measured, as JSON
    val_acc REAL, test_acc REAL, sub_val_acc REAL, sub_test_acc REAL,
    test_loss REAL, sub_test_loss REAL, wall_time REAL,
    weights TEXT,                         -- path of the safetensors file, relative to the store
    finished_at REAL NOT NULL,
    UNIQUE (task, arm, seed, run_hash)
);
CREATE TABLE IF NOT EXISTS lambdas (
    run_id INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, layer TEXT NOT NULL, value REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS epochs (
    run_id INTEGER NOT NULL REFERENCES runs(id), epoch INTEGER NOT NULL, step INTEGER NOT NULL,
    train_loss REAL, val_acc REAL, val_loss REAL
);
CREATE TABLE IF NOT EXISTS sweeps (
    id INTEGER PRIMARY KEY, command TEXT NOT NULL, started_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS deploy (
    task TEXT NOT NULL, base_hash TEXT NOT NULL, seed INTEGER NOT NULL, model TEXT NOT NULL,
    section TEXT NOT NULL, data TEXT NOT NULL,
    UNIQUE (task, base_hash, seed, model, section)
);
CREATE INDEX IF NOT EXISTS lambdas_run ON lambdas(run_id);
CREATE INDEX IF NOT EXISTS epochs_run ON epochs(run_id);
"""

DB_NAME = "results.sqlite"


class StoreError(Exception):
    """The results file is not a store (not SQLite, or another program's database)."""


def check_overwrite(path: Path, mark: str) -> None:
    """Refuse to write ``path`` unless it is new or a file this program wrote before (one that holds
    ``mark`` near its start): a results store, notes or a directory given by mistake are never lost."""
    if path.is_dir():
        raise ConfigError(f"{path} is a directory: give the path of a file to write")
    if not path.exists():
        return
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError as e:
        raise ConfigError(f"cannot read {path} to check what it is ({e.strerror})") from None
    if mark not in head:
        raise ConfigError(f"{path} exists and is not a file this command wrote: choose another path (writing would "
                          "overwrite it)")


class Store:
    def __init__(self, out_dir: str | os.PathLike):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / DB_NAME
        self.db = sqlite3.connect(self.path, timeout=60, isolation_level=None)  # transactions by hand
        try:
            self.db.execute("PRAGMA foreign_keys = ON")
            tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and "runs" not in tables:
                raise StoreError(f"{self.path} is an SQLite database of something else (tables: "
                                 f"{', '.join(sorted(tables))}); choose another --out")
            with self._tx() as db:  # executescript would commit on its own: one statement at a time
                for statement in filter(str.strip, SCHEMA.split(";")):
                    db.execute(statement)
        except sqlite3.DatabaseError as e:
            self.db.close()
            raise StoreError(f"{self.path} is not a results store ({e}); choose another --out or move the file") from None
        except BaseException:
            self.db.close()
            raise

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _tx(self, immediate: bool = False):
        """One transaction: committed on success, rolled back on any exception. ``immediate`` takes
        the write lock at once, so a check-then-insert cannot interleave with another process's."""
        self.db.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def record_sweep(self, command: str) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO sweeps (command, started_at) VALUES (?, ?)", (command, time.time()))

    def has(self, cfg: RunConfig) -> bool:
        row = self.db.execute("SELECT 1 FROM runs WHERE task=? AND arm=? AND seed=? AND run_hash=?",
                              (cfg.task, cfg.arm, cfg.seed, cfg.run_hash)).fetchone()
        return row is not None

    def _write_weights(self, cfg: RunConfig, state_dict: dict) -> str:
        """The weights in a file no other run or process uses; its path relative to the store."""
        from safetensors.torch import save_file
        folder = self.dir / "weights"
        folder.mkdir(exist_ok=True)
        rel = Path("weights") / f"{cfg.task}__{cfg.arm}__{cfg.run_hash}__seed{cfg.seed}__{uuid.uuid4().hex[:12]}.safetensors"
        fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=folder)
        os.close(fd)
        try:
            save_file({k: v.contiguous() for k, v in state_dict.items()}, tmp)
            os.replace(tmp, self.dir / rel)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return str(rel)

    def add(self, cfg: RunConfig, result) -> int:
        """Store a finished run: its weights file, then every row in one transaction. If another
        process stored the same run meanwhile, nothing is kept and ``sqlite3.IntegrityError`` is raised."""
        weights = None if result.state_dict is None else self._write_weights(cfg, result.state_dict)
        m = result.metrics
        try:
            with self._tx(immediate=True) as db:
                cur = db.execute(
                    "INSERT INTO runs (task, arm, seed, run_hash, base_hash, variant, config, metrics, val_acc, "
                    "test_acc, sub_val_acc, sub_test_acc, test_loss, sub_test_loss, wall_time, weights, finished_at) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (cfg.task, cfg.arm, cfg.seed, cfg.run_hash, cfg.base_hash, cfg.variant,
                     json.dumps(cfg.relevant(), sort_keys=True), json.dumps(m, sort_keys=True),
                     m.get("val_acc"), m.get("test_acc"), m.get("sub_val_acc"), m.get("sub_test_acc"),
                     m.get("test_loss"), m.get("sub_test_loss"), m.get("wall_time"), weights, time.time()))
                run_id = cur.lastrowid
                db.executemany("INSERT INTO lambdas VALUES (?,?,?,?)",
                               [(run_id, s, layer, v) for s, layer, v in result.lambdas])
                db.executemany("INSERT INTO epochs VALUES (?,?,?,?,?,?)",
                               [(run_id, e["epoch"], e["step"], e["train_loss"], e["val_acc"], e["val_loss"])
                                for e in result.epochs])
        except BaseException:
            if weights is not None:  # this run's own file: no row will ever point to it
                (self.dir / weights).unlink(missing_ok=True)
            raise
        return run_id

    # deployment results (``lambda-gelu deploy``): one row per (task, experiment, seed, model, section)

    def deploy_sections(self, task: str, base_hash: str, seed: int, model: str) -> set[str]:
        return {r[0] for r in self.db.execute(
            "SELECT section FROM deploy WHERE task=? AND base_hash=? AND seed=? AND model=?",
            (task, base_hash, seed, model))}

    def add_deploy(self, task: str, base_hash: str, seed: int, model: str, sections: dict[str, object],
                   replace: bool = False) -> None:
        """Store deployment sections (JSON-able) in one transaction; ``replace`` overwrites existing ones."""
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        with self._tx() as db:
            for section, data in sections.items():
                db.execute(f"{verb} INTO deploy VALUES (?,?,?,?,?,?)",
                           (task, base_hash, seed, model, section, json.dumps(data)))

    def replace_deploy_section(self, task: str, base_hash: str, section: str, seed: int, model: str, data) -> None:
        """Replace every row of ``section`` for the experiment by one (e.g. a fresh latency table)."""
        with self._tx() as db:
            db.execute("DELETE FROM deploy WHERE task=? AND base_hash=? AND section=?", (task, base_hash, section))
            db.execute("INSERT INTO deploy VALUES (?,?,?,?,?,?)",
                       (task, base_hash, seed, model, section, json.dumps(data)))

    def deploy_rows(self) -> list[tuple[str, str, int, str, str, object]]:
        return [(*r[:5], json.loads(r[5])) for r in self.db.execute(
            "SELECT task, base_hash, seed, model, section, data FROM deploy ORDER BY task, seed")]

    def runs(self) -> list[dict]:
        cur = self.db.execute("SELECT * FROM runs ORDER BY task, base_hash, variant, seed")
        cols = [c[0] for c in cur.description]
        rows = [dict(zip(cols, r)) for r in cur.fetchall()]
        for r in rows:
            r["config"], r["metrics"] = json.loads(r["config"]), json.loads(r["metrics"])
        return rows

    def lambda_rows(self) -> list[tuple]:
        return self.db.execute("SELECT run_id, step, layer, value FROM lambdas ORDER BY run_id, step").fetchall()

    def sweeps(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT command FROM sweeps ORDER BY id")]

    def export_csv(self, dest: str | os.PathLike | None = None) -> list[Path]:
        """Write runs.csv (one row per run, config and metrics as JSON) and lambdas.csv (λ trajectories)."""
        import csv
        cols = ["id", "task", "arm", "variant", "seed", "run_hash", "base_hash", "val_acc", "test_acc",
                "sub_val_acc", "sub_test_acc", "test_loss", "sub_test_loss", "wall_time", "weights", "config", "metrics"]
        lambda_cols = ["run_id", "step", "layer", "lambda"]
        dest = Path(dest) if dest else self.dir
        if dest.exists() and not dest.is_dir():
            raise ConfigError(f"--to {dest} is a file: give a directory for runs.csv and lambdas.csv")
        check_overwrite(dest / "runs.csv", ",".join(cols))
        check_overwrite(dest / "lambdas.csv", ",".join(lambda_cols))
        dest.mkdir(parents=True, exist_ok=True)
        with open(dest / "runs.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for r in self.runs():
                w.writerow([json.dumps(r[c], sort_keys=True) if c in ("config", "metrics") else r[c] for c in cols])
        with open(dest / "lambdas.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(lambda_cols)
            w.writerows(self.lambda_rows())
        return [dest / "runs.csv", dest / "lambdas.csv"]
