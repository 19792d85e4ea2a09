"""Reading the store of a sweep that is still running in another process (tests only)."""
import os
import sqlite3


def stored_runs(out):
    """(task, arm, seed, run_hash, finished_at) of every stored run, in order. A live sweep creates its
    results.sqlite a moment before writing the schema; until then there are no runs, not an error."""
    with sqlite3.connect(os.path.join(out, "results.sqlite")) as db:
        try:
            return db.execute("SELECT task, arm, seed, run_hash, finished_at FROM runs ORDER BY id").fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" not in str(e):
                raise
            return []
