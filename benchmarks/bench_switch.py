"""Overhead of switch_at="auto": what its sign-pattern checks add to training, on the lab's tasks.

    python benchmarks/bench_switch.py [--threads 2] [--reps 20] [--tasks fmnist-mlp ...]

For each task, one training step (forward, backward, optimizer step, schedule step) of the
lambda-harden arm at the task's batch size, and one check (the lab's probe, sized for about 1% of training time,
through the model in eval mode, signs packed and compared), timed interleaved. A check runs every 2% of training, so the
overhead is check / (steps between checks × step), with the task's own number of steps.
Writes benchmarks/results/switch.json.
"""
from __future__ import annotations

import argparse
import math

import torch

import lambda_gelu as lg
from _common import header, interleaved, positive_int, print_table, save
from lambda_gelu_lab.config import RunConfig
from lambda_gelu_lab.tasks import TASKS
from lambda_gelu_lab.train import build_model, loss_fn, make_optimizer, probe_batch

TASK_NAMES = ("mnist1d-mlp", "fmnist-mlp", "fmnist-resnet", "fmnist-vit", "stdlib-gpt")


def measure(name: str, reps: int) -> dict:
    task = TASKS[name]
    splits = task.load(None)
    cfg = RunConfig(task=name, arm="lambda-harden", switch_at="auto", **task.defaults)
    model = build_model(task, splits, cfg)
    opt = make_optimizer(model, cfg)
    total = cfg.epochs * math.ceil(len(splits.x_train) / cfg.batch_size)
    sched = lg.HardeningSchedule(model, total, "auto", probe=probe_batch(splits.x_train, cfg.batch_size, total))
    x, y = splits.x_train[:cfg.batch_size], splits.y_train[:cfg.batch_size]

    def step():
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step(0)  # the schedule's own work, without advancing it

    times = interleaved({"step": step, "check": sched._check}, reps)
    every = sched.auto.check_interval(total)
    overhead = times["check"] / (every * times["step"])
    return {"task": name, "batch": cfg.batch_size, "probe": len(sched._probe), "total_steps": total, "every": every,
            "step_ms": times["step"] * 1e3, "check_ms": times["check"] * 1e3, "overhead": overhead}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--reps", type=positive_int, default=20)
    ap.add_argument("--tasks", nargs="+", default=list(TASK_NAMES), choices=sorted(TASKS))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = [measure(name, args.reps) for name in args.tasks]
    head = header()
    print_table("switch_at='auto': check cost against training", head,
                [[r["task"], r["batch"], r["probe"], r["total_steps"], r["every"], f"{r['step_ms']:.1f}", f"{r['check_ms']:.1f}",
                  f"{100 * r['overhead']:.2f}%"] for r in results],
                ["task", "batch", "probe", "steps", "check every", "step ms", "check ms", "overhead"])
    print(save("switch", {"header": head, "reps": args.reps, "results": results}))


if __name__ == "__main__":
    main()
