"""Many samples in flight: continuous batching without batch-specific code in the methods.

Each sample decodes in its own thread, written exactly as at batch size 1. Only one thread runs
at a time (a baton): the scheduler hands it over, in a fixed order, to every sample that can go
on, until each one waits for a forward (`ModelRunner.run_forward` inside a sample's thread) or is
done. Then the waiting requests of each model run as one batched forward
(`ModelRunner.forward_batch`), and their samples go on. A finished sample frees its slot for the
next one at once. The order of everything is fixed, so a batched run is reproducible.

Per-sample costs: methods (and PRMs, routers) read cost counters as deltas around their work, and
other samples run in between. So each sample sees its own values of every live `CostCounter`:
they are swapped in when the sample takes the baton and out when it hands it back; the
counters' own totals keep accumulating every sample's work.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable, Iterator

import torch

from rstitch.engines.base import CostCounter, ForwardRequest, ModelRunner, live_counters

_LOCAL = threading.local()
_SCALARS = tuple(f.name for f in fields(CostCounter) if f.name != "forward_shapes")


def current_task() -> "Task | None":
    """The batched sample the calling thread decodes, or None (batch size 1, or outside a run)."""
    return getattr(_LOCAL, "task", None)


class BatchAborted(Exception):
    """Raised inside the samples still in flight when another sample failed."""


@dataclass
class Finished:
    key: Any
    value: Any  # what the sample's function returned
    wall_s: float  # from the sample's start to its end, waiting for the batch included
    own_s: float  # the part spent running its own code between forwards (not waiting)


class Task:
    """One sample's thread and its hand-over points."""

    def __init__(self, key: Any, fn: Callable[[], Any], scheduler: "BatchScheduler"):
        self.key, self.fn, self.scheduler = key, fn, scheduler
        self.go = threading.Semaphore(0)
        self.request: ForwardRequest | None = None
        self.output: tuple[torch.Tensor, torch.Tensor | None, float] | None = None
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.started = time.perf_counter()
        self.own_s = 0.0
        self.costs: dict[int, tuple[CostCounter, dict[str, Any]]] = {}  # this sample's view of each counter
        self._locals: dict[int, tuple[Any, Any]] = {}
        self.thread = threading.Thread(target=self._main, name=f"sample-{key}", daemon=True)

    def _main(self) -> None:
        self.go.acquire()
        _LOCAL.task = self
        try:
            if self.scheduler.aborted:
                raise BatchAborted("another sample of the batch failed")
            self.value = self.fn()
        except BaseException as err:  # noqa: BLE001 - handed to the scheduler, which raises it
            self.error = err
        finally:
            self.done = True
            self.scheduler.back.release()

    def local(self, owner: Any, factory: Callable[[], Any]) -> Any:
        """`owner`'s state for this sample (e.g. a PRM's prefix cache), made by `factory` once."""
        if id(owner) not in self._locals:
            self._locals[id(owner)] = (owner, factory())  # holding owner keeps its id unique
        return self._locals[id(owner)][1]

    def submit(self, request: ForwardRequest) -> tuple[torch.Tensor, torch.Tensor | None, float]:
        """Wait (handing the baton back) until the scheduler ran this request in a batch."""
        self.request, self.output = request, None
        self.scheduler.back.release()
        self.go.acquire()
        if self.output is None:
            raise BatchAborted("another sample of the batch failed")
        return self.output


class BatchScheduler:
    """Keeps up to `batch_size` samples decoding; one batched forward per model and round."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.back = threading.Semaphore(0)  # a sample hands the baton back
        self.aborted = False
        self._global: dict[int, dict[str, Any]] = {}

    def run(self, jobs: Iterable[tuple[Any, Callable[[], Any]]]) -> Iterator[Finished]:
        """Decode `(key, fn)` jobs, yielding each as it finishes (in a fixed order)."""
        pending = iter(jobs)
        active: list[Task] = []
        try:
            while True:
                yield from self._advance(active, pending)
                if not active:
                    return
                self._run_forwards(active)
        finally:
            self._abort(active)

    def _advance(self, active: list[Task], pending: Iterator) -> Iterator[Finished]:
        """Let every sample that can go on run to its next forward; refill finished slots."""
        runnable = [t for t in active if t.request is None or t.output is not None]
        while True:
            while len(active) < self.batch_size and (job := next(pending, None)) is not None:
                task = Task(job[0], job[1], self)
                task.thread.start()
                active.append(task)
                runnable.append(task)
            if not runnable:
                return
            for task in runnable:
                self._slice(task)
            runnable = []
            for task in [t for t in active if t.done]:
                active.remove(task)
                if task.error is not None:
                    raise task.error
                yield Finished(task.key, task.value, time.perf_counter() - task.started, task.own_s)

    def _slice(self, task: Task) -> None:
        """Run `task` until it waits for a forward or ends, with its own cost counters in place."""
        task.request = None if task.output is not None else task.request
        self._swap_in(task)
        start = time.perf_counter()
        task.go.release()
        self.back.acquire()
        task.own_s += time.perf_counter() - start
        self._swap_out(task)

    def _run_forwards(self, active: list[Task]) -> None:
        groups: dict[int, list[Task]] = {}
        for task in active:
            groups.setdefault(id(task.request.runner), []).append(task)
        for tasks in groups.values():
            runner: ModelRunner = tasks[0].request.runner
            start = time.perf_counter()
            outputs = runner.forward_batch([t.request for t in tasks])
            seconds = runner.elapsed_since(start)
            for task, (logits, hidden) in zip(tasks, outputs):
                task.output = (logits, hidden, seconds)

    def _abort(self, active: list[Task]) -> None:
        """Unwind the samples still waiting (after an error or an abandoned run)."""
        self.aborted = True
        for task in active:
            if not task.done:
                task.output = None
                task.go.release()
                task.thread.join()

    # --- per-sample cost counters --------------------------------------------------------
    def _swap_in(self, task: Task) -> None:
        for counter in live_counters():
            self._global[id(counter)] = _state(counter)
            own = task.costs.get(id(counter))
            _set_state(counter, own[1] if own is not None else _zero())

    def _swap_out(self, task: Task) -> None:
        for counter in live_counters():
            before = task.costs.get(id(counter), (counter, _zero()))[1]
            now = _state(counter)
            task.costs[id(counter)] = (counter, now)
            total = self._global.pop(id(counter), None) or _zero()
            total.update({k: total[k] + now[k] - before[k] for k in _SCALARS})
            total["forward_shapes"] = []  # the shapes are per sample (latency model): totals keep none
            _set_state(counter, total)
        self._global.clear()


def _state(counter: CostCounter) -> dict[str, Any]:
    return {**{k: getattr(counter, k) for k in _SCALARS}, "forward_shapes": counter.forward_shapes}


def _zero() -> dict[str, Any]:
    return {**{k: 0 for k in _SCALARS}, "forward_shapes": []}


def _set_state(counter: CostCounter, state: dict[str, Any]) -> None:
    for key, value in state.items():
        setattr(counter, key, value)
