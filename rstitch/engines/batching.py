"""Many samples in flight: continuous batching without batch-specific code in the methods.

Each sample decodes in its own greenlet, written exactly as at batch size 1; the waiting forwards
of each model run as one `ModelRunner.forward_batch`, in a fixed order, so a batched run is
reproducible. Each sample sees its own values of every live `CostCounter` (docs/batching.md).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import greenlet

from rstitch.engines.base import _CURRENT_TASK, CostCounter, ModelRunner, current_task, live_counters

__all__ = ["BatchAborted", "BatchScheduler", "Finished", "Task", "current_task"]


class BatchAborted(Exception):
    """Raised inside the samples still in flight when another sample failed."""


@dataclass
class Finished:
    key: Any
    value: Any  # what the sample's function returned
    wall_s: float  # from the sample's start to its end, waiting for the batch included
    own_s: float  # the part spent running its own code between forwards (not waiting)


class Task:
    """One sample's coroutine and its switch points."""

    def __init__(self, key: Any, fn: Callable[[], Any]):
        self.key, self.fn = key, fn
        self.request: Any = None  # a ForwardRequest, or a backend's own request (`run_request`)
        self.output: tuple[Any, float] | None = None  # its result and the batch's wall time
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.started = time.perf_counter()
        self.own_s = 0.0
        self.costs: dict[int, tuple[CostCounter, dict[str, Any]]] = {}  # this sample's view of each counter
        self._locals: dict[int, tuple[Any, Any]] = {}
        self.coroutine = greenlet.greenlet(self._main)

    def _main(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as err:  # noqa: BLE001 - handed to the scheduler, which raises it
            self.error = err
        finally:
            self.done = True

    def local(self, owner: Any, factory: Callable[[], Any]) -> Any:
        """`owner`'s state for this sample (e.g. a PRM's prefix cache), made by `factory` once."""
        if id(owner) not in self._locals:
            self._locals[id(owner)] = (owner, factory())  # holding owner keeps its id unique
        return self._locals[id(owner)][1]

    def submit(self, request: Any) -> tuple[Any, float]:
        """Wait (switching back to the scheduler) until this request ran in a batch."""
        self.request, self.output = request, None
        self.coroutine.parent.switch()
        if self.output is None:
            raise BatchAborted("another sample of the batch failed")
        return self.output


class BatchScheduler:
    """Keeps up to `batch_size` samples decoding; one batched forward per model and round."""

    MAX_WAIT = 2  # rounds a model's requests may be passed over

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self._waited: dict[int, int] = {}  # per model: rounds its requests were passed over

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
                task = Task(job[0], job[1])
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
        """Run `task` until it waits for a forward or ends, with its own cost counters in place: its
        change to each counter's scalars is added to the run's totals (the shapes are per sample)."""
        totals = {}
        for counter in live_counters():
            totals[id(counter)] = _state(counter)
            _set_state(counter, task.costs.get(id(counter), (counter, _zero()))[1])
        _CURRENT_TASK[0] = task
        start = time.perf_counter()
        try:
            task.coroutine.switch()
        finally:
            task.own_s += time.perf_counter() - start
            _CURRENT_TASK[0] = None
            for counter in live_counters():
                before, now = task.costs.get(id(counter), (counter, _zero()))[1], _state(counter)
                task.costs[id(counter)] = (counter, now)
                total = totals.get(id(counter)) or _zero()
                total.update({k: total[k] + now[k] - before[k] for k in CostCounter.SCALARS})
                total["forward_shapes"] = []  # the shapes are per sample (latency model): totals keep none
                _set_state(counter, total)

    def _run_forwards(self, active: list[Task]) -> None:
        """Run the largest group of requests waiting on one model, and any passed over `MAX_WAIT` times:
        the cheap model's samples go on while the other's requests gather into fuller batches."""
        groups: dict[int, list[Task]] = {}
        for task in active:
            groups.setdefault(id(task.request.runner), []).append(task)
        largest = max(groups, key=lambda key: len(groups[key]))
        for key, tasks in groups.items():
            if key != largest and self._waited.get(key, 0) < self.MAX_WAIT:
                self._waited[key] = self._waited.get(key, 0) + 1
                continue
            self._waited[key] = 0
            runner: ModelRunner = tasks[0].request.runner
            start = time.perf_counter()
            outputs = runner.forward_batch([t.request for t in tasks])
            seconds = runner.elapsed_since(start)
            for task, output in zip(tasks, outputs):
                task.output = (output, seconds)

    def _abort(self, active: list[Task]) -> None:
        """Unwind the samples still waiting (after an error or an abandoned run)."""
        for task in active:
            if task.coroutine and not task.done:  # started and waiting for a forward
                task.output = None
                self._slice(task)


def _state(counter: CostCounter) -> dict[str, Any]:
    return {**{k: getattr(counter, k) for k in CostCounter.SCALARS}, "forward_shapes": counter.forward_shapes}


def _zero() -> dict[str, Any]:
    return {**{k: 0 for k in CostCounter.SCALARS}, "forward_shapes": []}


def _set_state(counter: CostCounter, state: dict[str, Any]) -> None:
    for key, value in state.items():
        setattr(counter, key, value)
