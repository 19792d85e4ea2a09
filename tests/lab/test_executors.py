"""Where runs train: local processes (--workers) and Ray tasks (--executor ray) store exactly what the
sequential sweep stores; a worker that dies loses only its run, which is retried, or reported."""
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from types import SimpleNamespace

import pytest
from safetensors.torch import load_file

from lambda_gelu_lab import runner
from lambda_gelu_lab.cli import main
from lambda_gelu_lab.store import Store
from live_store import stored_runs

SWEEP = ["run", "wine-mlp", "--seeds", "2", "--epochs", "5", "--arms", "gelu", "lambda-harden",
         "--quiet", "--no-report", "--threads", "1"]


def _stored(out):
    """Every run's metrics (less its wall time) and weights, by (run hash, seed)."""
    with Store(out) as store:
        runs = store.runs()
    return {(r["run_hash"], r["seed"]): ({k: v for k, v in r["metrics"].items() if k != "wall_time"},
                            load_file(os.path.join(out, r["weights"])))
            for r in runs}


def _assert_same(a, b):
    assert a.keys() == b.keys() and len(a) == 4
    for h in a:
        assert a[h][0] == b[h][0], h
        assert a[h][1].keys() == b[h][1].keys()
        assert all(a[h][1][k].equal(b[h][1][k]) for k in a[h][1]), h


@pytest.mark.slow
def test_workers_store_what_the_sequential_sweep_stores(tmp_path):
    assert main(SWEEP + ["--out", str(tmp_path / "seq")]) == 0
    assert main(SWEEP + ["--out", str(tmp_path / "par"), "--workers", "2"]) == 0
    _assert_same(_stored(str(tmp_path / "seq")), _stored(str(tmp_path / "par")))


@pytest.mark.slow
def test_ray_stores_what_the_sequential_sweep_stores(tmp_path):
    pytest.importorskip("ray")
    assert main(SWEEP + ["--out", str(tmp_path / "seq")]) == 0
    assert main(SWEEP + ["--out", str(tmp_path / "ray"), "--executor", "ray", "--workers", "2"]) == 0
    _assert_same(_stored(str(tmp_path / "seq")), _stored(str(tmp_path / "ray")))


def test_ray_missing_is_one_clear_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    assert main(SWEEP + ["--out", str(tmp_path), "--executor", "ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1] == "error: --executor ray needs Ray: pip install 'lambda-gelu[ray]'", err
    assert not os.path.exists(tmp_path / "weights")


def test_an_address_where_nothing_listens_fails_in_seconds(tmp_path, capsys):
    pytest.importorskip("ray")
    start = time.monotonic()
    assert main(SWEEP + ["--out", str(tmp_path), "--executor", "ray", "--address", "127.0.0.1:1"]) == 2
    assert "error: cannot reach the Ray cluster at 127.0.0.1:1" in capsys.readouterr().err
    assert time.monotonic() - start < 120  # Ray alone would keep retrying for minutes


# --- a worker process killed mid-sweep ---------------------------------------------------------------



def _processes():
    """(pid, parent pid, command line) of every process."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    yield int(entry), ppid, f.read()
            except OSError:
                continue


def _pool_workers(sweep_pid):
    """The multiprocessing workers the sweep spawned (--workers)."""
    return [pid for pid, ppid, cmd in _processes() if ppid == sweep_pid and b"spawn_main" in cmd]


def _ray_workers(sweep_pid):
    """Ray's worker processes while they train a run (Ray names them after the task)."""
    return [pid for pid, _, cmd in _processes() if cmd.startswith(b"ray::train_remote")]


EXECUTION = {"processes": (["--workers", "2"], _pool_workers), "ray": (["--executor", "ray", "--workers", "2"], _ray_workers)}
# runs of near a second each: a retried run must outlive the gaps between the killer's looks at /proc, which grow
# on a loaded machine (at 15 epochs, 0.2 s a run, a retry under load finished unseen and nothing was lost)
KILLED_SWEEP = ["run", "breast-cancer-mlp", "--seeds", "4", "--epochs", "100", "--arms", "gelu", "lambda-harden",
                "--quiet", "--no-report"]


def _sweep_with_killer(out, executor, kill_again: bool):
    """Start a sweep on 2 workers; once a run is stored, SIGKILL a worker (and, if ``kill_again``, every
    worker seen after it, so the retry dies too). Returns (exit status, stderr, rows stored before the kill)."""
    args, workers = EXECUTION[executor]
    proc = subprocess.Popen([sys.executable, "-m", "lambda_gelu_lab", *KILLED_SWEEP, "--out", out, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read().decode()))
    reader.start()
    db = os.path.join(out, "results.sqlite")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.exists(db) and stored_runs(out) and workers(proc.pid):
            break
        time.sleep(0.02)
    if proc.poll() is not None:
        reader.join()
        pytest.fail(f"the sweep ended before the kill: {err[0][-2000:]}")
    before = stored_runs(out)
    killed = set()
    while proc.poll() is None and time.monotonic() < deadline:
        for pid in workers(proc.pid):
            if pid not in killed and (kill_again or not killed):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.02)
    proc.wait()
    reader.join()
    assert killed, "no worker was running to be killed: the test proved nothing"
    return proc.returncode, err[0], before


@pytest.mark.slow
@pytest.mark.parametrize("executor", list(EXECUTION))
def test_a_killed_worker_loses_only_its_run_which_is_retried(tmp_path, executor):
    if executor == "ray":
        pytest.importorskip("ray")
    out = str(tmp_path / "k")
    status, err, before = _sweep_with_killer(out, executor, kill_again=False)
    assert status == 0, err
    if executor == "processes":
        assert "a worker process died;" in err and "are retried" in err
    after = stored_runs(out)
    assert after[:len(before)] == before
    keys = [r[:4] for r in after]
    assert len(keys) == 8 and len(set(keys)) == 8
    assert len([f for f in os.listdir(os.path.join(out, "weights")) if f.endswith(".safetensors")]) == 8


@pytest.mark.slow
@pytest.mark.parametrize("executor", list(EXECUTION))
def test_workers_that_keep_dying_are_reported_and_the_finished_runs_kept(tmp_path, executor):
    if executor == "ray":
        pytest.importorskip("ray")
    out = str(tmp_path / "k")
    status, err, before = _sweep_with_killer(out, executor, kill_again=True)
    assert status == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "runs were lost" in last and "rerun the same command" in last, err
    kept = stored_runs(out)
    assert kept[:len(before)] == before and len(kept) < 8
    assert len(os.listdir(os.path.join(out, "weights"))) == len(kept)  # no half-written run
    # rerunning trains exactly the lost runs
    subprocess.run([sys.executable, "-m", "lambda_gelu_lab", *KILLED_SWEEP, "--out", out],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = stored_runs(out)
    assert after[:len(kept)] == kept and len({r[:4] for r in after}) == 8


def _pools_that_break(after: list[int], error=BrokenProcessPool("A child process terminated abruptly")):
    """Stand-ins for ProcessPoolExecutor, one per attempt: the n-th runs the first ``after[n]`` runs
    handed to it, then refuses more with ``error``, as a real pool does once a worker has died while runs
    were still being submitted (a race the killing tests above hit only now and then), and raises it from
    its shutdown too if it broke (CPython's pool, to 3.11: OSError "handle is closed" from either)."""
    attempts = iter(after)

    class Pool:
        def __init__(self, **_):
            self.left, self.broken = next(attempts), False

        def shutdown(self):
            if self.broken and isinstance(error, OSError):
                raise error

        def submit(self, fn, cfg, *_):
            if self.left == 0:
                self.broken = True
                raise error
            self.left -= 1
            future = Future()
            future.set_result(f"result of seed {cfg.seed}")
            return future
    return Pool


@pytest.mark.parametrize("error", [BrokenProcessPool("A child process terminated abruptly"),
                                   OSError("handle is closed")], ids=["broken", "closed-pipe"])
@pytest.mark.parametrize("after, finished, lost", [((3, 8), 8, 0), ((3, 3), 6, 2)])
def test_a_pool_broken_while_runs_are_handed_out_loses_only_the_runs_not_handed_out(
        monkeypatch, capsys, after, finished, lost, error):
    monkeypatch.setattr(runner.cf, "ProcessPoolExecutor", _pools_that_break(list(after), error))
    todo = [(None, SimpleNamespace(task="wine-mlp", variant="gelu", seed=seed)) for seed in range(8)]
    done = []
    try:
        runner._run_processes(todo, lambda cfg, result: done.append((cfg.seed, result)), {}, False, 2, 1)
    except runner.SweepError as e:
        assert lost and str(e).startswith(f"{lost} runs were lost") and "seed 6" in str(e)
    else:
        assert not lost
    assert sorted(done) == [(s, f"result of seed {s}") for s in range(finished)]
    assert "a worker process died; 5 unfinished runs are retried" in capsys.readouterr().err
