"""Results in one SQLite file: a row per finished run, written in one transaction with its curves.

A run is keyed by (task, arm, seed, run_hash). Nothing is written until a run has finished, and then
everything about it is written at once, so a sweep killed at any moment loses only the run that was
in flight, and a rerun skips every run already stored.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path

from .config import RunConfig

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
CREATE INDEX IF NOT EXISTS lambdas_run ON lambdas(run_id);
CREATE INDEX IF NOT EXISTS epochs_run ON epochs(run_id);
"""

DB_NAME = "results.sqlite"


class Store:
    def __init__(self, out_dir: str | os.PathLike):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / DB_NAME
        self.db = sqlite3.connect(self.path, timeout=30)
        self.db.execute("PRAGMA foreign_keys = ON")
        with self.db:
            self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _tx(self):
        with self.db:  # commits on success, rolls back on any exception
            yield self.db

    def record_sweep(self, command: str) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO sweeps (command, started_at) VALUES (?, ?)", (command, time.time()))

    def has(self, cfg: RunConfig) -> bool:
        row = self.db.execute("SELECT 1 FROM runs WHERE task=? AND arm=? AND seed=? AND run_hash=?",
                              (cfg.task, cfg.arm, cfg.seed, cfg.run_hash)).fetchone()
        return row is not None

    def add(self, cfg: RunConfig, result) -> int:
        """Store a finished run: weights file first (atomic rename), then every row in one transaction."""
        weights = None
        if result.state_dict is not None:
            from safetensors.torch import save_file
            rel = Path("weights") / f"{cfg.task}__{cfg.arm}__{cfg.run_hash}__seed{cfg.seed}.safetensors"
            (self.dir / rel).parent.mkdir(exist_ok=True)
            tmp = self.dir / (str(rel) + ".tmp")
            save_file({k: v.contiguous() for k, v in result.state_dict.items()}, str(tmp))
            os.replace(tmp, self.dir / rel)
            weights = str(rel)
        m = result.metrics
        with self._tx() as db:
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
        return run_id

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
