"""Run a forward only as far as a hook needs: the hook captures what a module receives or returns, then stops
the forward by raising :class:`Stop` (the refit and the blockwise schedule need one layer's input, not the
network's output).

Two ways to reach the modules of one network in forward order on a list of batches, each giving every batch's
``(args, kwargs)`` at a module's call (None where the forward never calls it):

- :class:`RestartedForwards` runs each batch from the start up to the module, for every module: simple, and the
  reference. Reaching n modules spread over the network runs each batch about n/2 times.
- :class:`PausedForwards` runs each batch's forward in a thread of its own, one thread at a time, on to the module's
  call and pauses it there; the next module is reached from where each forward paused, so every batch runs once in
  all. What the caller changes in the network after the modules reached so far (the refit's solved layers) is what
  the rest of each forward computes with, as when it restarts: the same operations in the same order. Each paused
  forward keeps its live tensors (for a transformer, about one layer's activations a batch) until it is closed.
"""
from __future__ import annotations

import threading

import torch
import torch.nn as nn

from ..core.batches import run_batch

__all__ = ["Stop", "run_to_hook", "RestartedForwards", "PausedForwards"]


class Stop(Exception):
    """Raised from a hook once what it came for is captured: the rest of the forward is not needed."""


def run_to_hook(model: nn.Module, batch, handle) -> None:
    """Run ``batch`` through ``model`` until the hook behind ``handle`` has what it came for; remove it."""
    try:
        run_batch(model, batch)
    except Stop:
        pass
    finally:
        handle.remove()


class RestartedForwards:
    """Every batch run from the start to the module asked for, for each module (the reference)."""

    def __init__(self, model: nn.Module, batches: list):
        self.model, self.batches = model, batches

    def reach(self, module: nn.Module) -> list[tuple | None]:
        """Each batch's ``(args, kwargs)`` at ``module``'s first call, or None where the forward does not call it."""
        seen = []
        for batch in self.batches:
            got = {}

            def grab(mod, args, kwargs):
                got["in"] = (args, kwargs)
                raise Stop

            with torch.no_grad():
                run_to_hook(self.model, batch, module.register_forward_pre_hook(grab, with_kwargs=True))
            seen.append(got.get("in"))
        return seen

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PausedForwards(RestartedForwards):
    """Every batch's forward in a thread of its own, run on to the module asked for and paused at its call. Modules
    must be asked for in the order the forward calls them (a module called before the one a forward paused at is
    not reached again: None). :meth:`close` (or leaving the ``with`` block) ends the paused forwards."""

    def __init__(self, model: nn.Module, batches: list):
        super().__init__(model, batches)
        self._forwards = [_Forward(model, batch) for batch in batches]

    def reach(self, module: nn.Module) -> list[tuple | None]:
        def pause(mod, args, kwargs):
            forward = getattr(_running, "forward", None)
            if forward is not None:  # only the forwards' threads pause; the caller may run the module itself
                forward.pause(args, kwargs)

        handle = module.register_forward_pre_hook(pause, with_kwargs=True)
        try:
            for forward in self._forwards:  # one at a time: each runs with all the machine's threads
                forward.resume()
        finally:
            handle.remove()  # before the caller runs anything: a paused forward is already inside the hook
        for forward in self._forwards:
            if forward.error is not None:
                self.close()
                raise forward.error
        return [forward.seen for forward in self._forwards]

    def close(self) -> None:
        for forward in self._forwards:
            forward.end()


_running = threading.local()  # the _Forward a thread runs


class _Forward:
    """One batch's forward, in its own thread, paused by the hook and resumed by the caller."""

    def __init__(self, model: nn.Module, batch):
        self.model, self.batch = model, batch
        self.seen, self.error, self.finished, self.ending = None, None, False, False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._go, self._paused = threading.Semaphore(0), threading.Semaphore(0)

    def _run(self) -> None:
        _running.forward = self
        try:
            with torch.no_grad():
                run_batch(self.model, self.batch)
        except Stop:
            pass
        except BaseException as e:  # handed to the caller, which raises it
            self.error = e
        finally:
            self.finished, self.seen = True, None
            self._paused.release()

    def pause(self, args, kwargs) -> None:  # in the forward's thread
        self.seen = (args, kwargs)
        self._paused.release()
        self._go.acquire()
        if self.ending:
            raise Stop

    def resume(self) -> None:
        """Runs the forward on until it pauses again or finishes (at once, if it has finished)."""
        if self.finished:
            self.seen = None
            return
        self.seen = None
        if self._thread.ident is None:
            self._thread.start()
        else:
            self._go.release()
        self._paused.acquire()

    def end(self) -> None:
        if self._thread.ident is not None and not self.finished:
            self.ending = True
            self._go.release()
            self._thread.join()
