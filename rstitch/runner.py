"""Decode every problem of a dataset with one method, grade, measure, and record the run."""
from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rstitch.data import load_dataset_records
from rstitch.data.context import ContextCheck
from rstitch.data.prompts import PromptFormat
from rstitch.engines import ModelPair, Sampler, check_engine_installed, engine_class, require
from rstitch.engines.batching import BatchScheduler
from rstitch.engines.cache import clear_pairs, get_pair, is_loaded
from rstitch.errors import ConfigError
from rstitch.grading import grade_sample
from rstitch.grading.sandbox import check_code_sandbox
from rstitch.latency.model import load_pair_latency
from rstitch.methods import DecodeContext, DecodeResult, Method, build_method
from rstitch.methods.base import EXTRA_FLOPS, model_flops
from rstitch.results import SampleStore
from rstitch.results.baseline import planned_runs
from rstitch.results.keys import RunIdentity, identify
from rstitch.results.measurement import available_cpus, sample_measurement, summarize_measurement
from rstitch.results.summary import summarize_run

WARMUP_TOKENS = 16


# Set by the CLI's SIGINT handler beside the KeyboardInterrupt it raises. Python drops an exception
# raised inside a finalizer (a sequence's KV slot is released by one), so a Ctrl-C that lands there
# would be lost; the decode loop also checks this after every saved sample.
INTERRUPT_REQUESTED = threading.Event()


def load_models(cfg: dict[str, Any], method: Method, records: list, prompt: PromptFormat, max_new_tokens: int,
                batch_size: int) -> tuple[ModelPair, dict | None]:
    """The run's pair (cached across a sweep's jobs) and its fitted latency models (None: no
    `latency_dir`, or none fitted there), checked by the engine's class before any model loads
    (device, installed, memory for the batch and the longest sample) and once loaded (threads, the
    capabilities the method reads): one line before any sample, not an error mid-run."""
    import torch

    engine = engine_class(cfg["engine"]["name"])
    engine.check_device(cfg["pair"])
    check_engine_installed(cfg["engine"]["name"])
    if not is_loaded(cfg["pair"], cfg["engine"]):
        clear_pairs()
        engine.check_memory(cfg["pair"], cfg["engine"], batch_size,
                            lambda tokenizer: max(len(prompt.encode(tokenizer, r.problem)) for r in records), max_new_tokens)
    pair = get_pair(cfg["pair"], cfg["engine"])
    largest = max(m.num_parameters for m in pair.models().values())
    threads = engine.default_threads(cfg["engine"], pair_device(pair), largest, available_cpus())
    if threads is not None:
        torch.set_num_threads(threads)
    if method.reads_hidden_states:
        for model in pair.models().values():
            require(model, "hidden_states", f"method '{method.name}' (it reads the models' last hidden states)")
    latency_dir = cfg.get("latency_dir")
    latency_models = load_pair_latency(latency_dir, pair) if latency_dir else None
    if batch_size > 1 and latency_models is None:
        where = f"in latency_dir '{latency_dir}'" if latency_dir else "(latency_dir is null)"
        raise ConfigError(f"batch_size > 1 estimates batch-1 latency from the pair's fitted latency models, and none were found "
                          f"{where}; fit them with scripts/profile_latency.py or run batch_size=1")
    return pair, latency_models


def engine_threads(pair: ModelPair) -> int:
    """The compute threads of the pair's engine (llama.cpp's own, else torch's)."""
    import torch

    return int(getattr(pair.llm, "num_threads", None) or torch.get_num_threads())


def pair_device(pair: ModelPair) -> str:
    """Where the pair's models run."""
    return str(getattr(pair.llm, "device", "cpu"))


def decode_cpu_clock(threads: int) -> Callable[[], float]:
    """The CPU clock of the decoding thread(s): with one compute thread the engine computes on the
    calling thread, whose own clock leaves out the process's other threads (progress bar, logger);
    with more, the process's, which sums the compute threads'."""
    return time.thread_time if threads == 1 else time.process_time


def sample_seed(base_seed: int, problem_id: str, sample_index: int) -> int:
    """Independent of run order, so a resumed run draws the same tokens."""
    digest = hashlib.sha256(f"{base_seed}/{problem_id}/{sample_index}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def estimate_latency(pair: ModelPair, latency_models: dict | None) -> float | None:
    """The fitted latency model's sum over this sample's forwards (stable where wall clock is noisy)."""
    if latency_models is None:
        return None
    return float(sum(latency_models[k].predict(n, kv) for k, m in pair.models().items() for n, kv in m.cost.forward_shapes))


def timed_decode(method: Method, prompt_ids: list[int], ctx: DecodeContext) -> tuple[DecodeResult, float, dict]:
    before = {k: m.cost.copy() for k, m in ctx.pair.models().items()}
    for m in ctx.pair.models().values():
        m.cost.forward_shapes.clear()
        m.synchronize()
    start = time.perf_counter()
    result = method.decode(prompt_ids, ctx)
    for m in ctx.pair.models().values():
        m.synchronize()
    latency = time.perf_counter() - start
    cost = {k: m.cost.since(before[k]).as_dict() for k, m in ctx.pair.models().items()}
    return result, latency, cost


def sample_flops(cost: dict[str, dict], pair: ModelPair, stats: dict[str, Any]) -> float:
    """2 x parameters x processed tokens per model of the pair (RSD section 3.3; judge forwards
    are on the LLM), plus what the method reports for its models outside the pair (PRM, router)
    as `stats[EXTRA_FLOPS]`."""
    models = pair.models()
    own = sum(model_flops(models[k].num_parameters, c["prefill_tokens"] + c["decode_steps"]) for k, c in cost.items())
    return own + float(stats.get(EXTRA_FLOPS, 0.0))


def decode_one_by_one(method: Method, ctx: DecodeContext, todo: list, fitted: dict, latency_models: dict | None,
                      batch_size: int = 1) -> Iterator[tuple[Any, int, dict[str, Any]]]:
    """Batch size 1: each sample timed on its own (the papers' latency protocol)."""
    for record, index in todo:
        ctx.sampler.reseed(sample_seed(ctx.sampler.seed, record.id, index))
        prompt_ids, sample_budget = fitted[record.id]
        sample_ctx = replace(ctx, problem=record.problem, metadata=record.metadata, max_new_tokens=sample_budget)
        threads = engine_threads(ctx.pair)
        cpu_clock = decode_cpu_clock(threads)
        cpu_start = cpu_clock()
        result, latency, cost = timed_decode(method, prompt_ids, sample_ctx)
        cpu_s = cpu_clock() - cpu_start
        row = sample_record(record, index, result, latency, cost, ctx.pair, method)
        row["latency_estimate_s"] = estimate_latency(ctx.pair, latency_models)
        row["measurement"] = sample_measurement(threads, pair_device(ctx.pair), latency, cpu_s,
                                                "thread" if cpu_clock is time.thread_time else "process")
        yield record, index, row


def decode_batched(method: Method, ctx: DecodeContext, todo: list, fitted: dict, latency_models: dict | None,
                   batch_size: int) -> Iterator[tuple[Any, int, dict[str, Any]]]:
    """`batch_size` samples in flight (engines/batching.py), each yielded as it finishes. Latency
    stays the batch-1 protocol: the fitted batch-1 model's estimate of the sample's forwards plus
    the time of its own work between them (method logic, sampling, unbatched PRM and judge
    forwards); the wall clock it spent in the batch is kept apart."""
    assert latency_models is not None, "load_models requires them when batch_size > 1"
    jobs = [((record, index), batched_job(method, ctx, record, index, fitted[record.id], latency_models))
            for record, index in todo]
    for finished in BatchScheduler(batch_size).run(jobs):
        (record, index), (result, cost, estimate) = finished.key, finished.value
        row = sample_record(record, index, result, estimate + finished.own_s, cost, ctx.pair, method)
        row.update(latency_estimate_s=estimate, latency_estimated=True, latency_overhead_s=finished.own_s,
                   batch_wall_s=finished.wall_s,
                   measurement=sample_measurement(engine_threads(ctx.pair), pair_device(ctx.pair), finished.wall_s, None))
        yield record, index, row


def batched_job(method: Method, ctx: DecodeContext, record, index: int, fitted: tuple[list[int], int],
                latency_models: dict) -> Callable[[], tuple[DecodeResult, dict, float | None]]:
    """One sample of a batched run, run as its own coroutine: its own sampler (seeded as at batch
    size 1) and, through the scheduler, its own view of the cost counters."""
    prompt_ids, sample_budget = fitted

    def job() -> tuple[DecodeResult, dict, float | None]:
        sampler = Sampler(temperature=ctx.sampler.temperature, top_p=ctx.sampler.top_p, seed=ctx.sampler.seed)
        sampler.reseed(sample_seed(sampler.seed, record.id, index))
        sample_ctx = replace(ctx, sampler=sampler, problem=record.problem, metadata=record.metadata, max_new_tokens=sample_budget)
        result = method.decode(prompt_ids, sample_ctx)
        cost = {k: m.cost.as_dict() for k, m in ctx.pair.models().items()}
        return result, cost, estimate_latency(ctx.pair, latency_models)
    return job


def sample_record(record, index: int, result: DecodeResult, latency: float, cost: dict, pair: ModelPair, method: Method) -> dict[str, Any]:
    response = pair.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    multiple_choice = bool(record.metadata.get("multiple_choice"))
    return {
        "id": record.id,
        "sample_index": index,
        "method": method.name,
        "response": response,
        "output_token_ids": result.token_ids,
        "token_sources": result.sources,
        **grade_sample(response, record.answer, multiple_choice=multiple_choice, metadata=record.metadata),  # answer, correct(, grading_error, code)
        "gold": record.answer,
        "latency_s": latency,
        "tokens": len(result.token_ids),
        "tokens_slm": result.tokens_by(0),
        "tokens_llm": result.tokens_by(1),
        "discarded_tokens": result.discarded_tokens,
        "switches": result.switches,
        "finish_reason": result.finish_reason,
        "finished_by_eos": result.finish_reason == "eos",
        "cost": cost,
        "flops": sample_flops(cost, pair, result.stats),
        "stats": result.stats,
    }


@dataclass
class RunPlan:
    """A run ready to decode: its method, records, pair, latency models, batch size and store,
    loaded and checked (`plan`) before any sample decodes. A context manager: leaving it
    closes the store, so other processes waiting on the run directory may go on."""

    identity: RunIdentity  # the config, its keys and directories
    logger: Any
    method: Method
    records: list[Any]  # the whole selection
    n_samples: int
    budget: int
    batch_size: int
    sampler: Sampler
    pair: ModelPair
    latency_models: dict | None
    store: SampleStore
    todo: list[tuple[Any, int]]  # (record, sample index) to decode, in order; prompts that fit the context
    fitted: dict[str, tuple[list[int], int]]  # problem id -> (prompt ids, the sample's token budget)
    planned: int  # samples of the planned problems, done or not (the progress bar's total)
    decode_wall_s: float = 0.0

    def __enter__(self) -> RunPlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.close()


def plan(run: RunIdentity, logger=None, problems: int | None = None) -> RunPlan:
    """Every check and every load of a run (`results.keys.identify`), before any sample decodes:
    what is missing among its samples (a resume decodes only that), each prompt fitted to the
    context. `problems` plans only the first so many problems (the results pages decode a problem at a
    time: rstitch/cli/report_decode.py)."""
    cfg, run_dir = run.config, run.run_dir
    n_samples, budget = count("n_samples", cfg["n_samples"]), count("max_new_tokens", cfg["max_new_tokens"])
    if problems is not None:
        count("problems", problems)
    batch_size = count("batch_size", cfg.get("batch_size", 1))
    records = load_dataset_records(**cfg["dataset"])
    if not records:
        raise ConfigError(f"dataset '{cfg['dataset']['name']}' selected no records")
    method = build_method(**cfg["method"])
    if any(r.metadata.get("answer_type") == "code" for r in records):  # before any model loads
        check_code_sandbox(bool(cfg.get("weak_code_sandbox", False)))
    prompt = PromptFormat(**cfg["prompt"])
    sampler = Sampler(**cfg["decoding"])
    pair, latency_models = load_models(cfg, method, records, prompt, budget, batch_size)
    block = records[:problems]
    check = ContextCheck(pair, budget, cfg.get("on_overflow", "error"))  # every prompt, before any decode
    prompts = {r.id: check.prompt_ids(r.id, r.problem, lambda p: prompt.encode(pair.tokenizer, p)) for r in block}
    fitted = {rid: fit for rid, fit in prompts.items() if fit is not None}
    store = SampleStore(run_dir, run.run_key)
    try:
        todo = [(r, k) for r in block if r.id in fitted for k in range(n_samples) if not store.done(r.id, k)]
        if logger is not None and not todo and logger.logged(run_dir):
            logger = None  # a finished run is logged once, not again by a resume that decodes nothing
    except BaseException:
        store.close()
        raise
    return RunPlan(run, logger, method, records, n_samples, budget, batch_size, sampler, pair, latency_models, store,
                   todo, fitted, len(block) * n_samples)


def decode(run: RunPlan) -> None:
    """Decode the planned samples into the store: an untimed warm-up, then one by one (batch size 1)
    or batched, each sample saved (and logged) as it finishes."""
    if run.logger is not None:
        run.logger.start(run.identity.name, run.identity.config, run.identity.name, run_dir=run.identity.run_dir)
    if run.todo:  # an untimed decode of the first prompt: what the engine cannot do for this method surfaces here
        record = run.todo[0][0]
        try:
            run.method.decode(run.fitted[record.id][0], DecodeContext(run.pair, run.sampler, min(WARMUP_TOKENS, run.budget),
                                                                     record.problem, record.metadata))
        except ConfigError as err:
            raise ConfigError(f"method '{run.method.name}' on engine '{run.identity.config['engine']['name']}': {err}") from None
        prepare_shapes(run.pair, run.batch_size, [run.fitted[r.id] for r, _ in run.todo])
    bar = tqdm(total=run.planned, initial=run.planned - len(run.todo), desc=run.method.name, unit="sample")
    start = time.perf_counter()
    decoder = decode_one_by_one if run.batch_size == 1 else decode_batched
    for record, _, row in decoder(run.method, DecodeContext(run.pair, run.sampler, run.budget), run.todo, run.fitted,
                                  run.latency_models, run.batch_size):
        save_sample(run, record, row, bar)
    run.decode_wall_s = time.perf_counter() - start
    bar.close()


def save_sample(run: RunPlan, record: Any, row: dict[str, Any], bar: tqdm) -> None:
    """Store (and log) a decoded sample, show the running accuracy and latency; stop here after a Ctrl-C."""
    sample_budget = run.fitted[record.id][1]
    if sample_budget < run.budget:  # on_overflow=truncate
        row["max_new_tokens"] = sample_budget
    run.store.append(row)
    if run.logger is not None:
        run.logger.log_sample(row)
    done = list(run.store.records.values())
    bar.set_postfix(acc=f"{sum(r['correct'] for r in done) / len(done):.3f}",
                    lat=f"{sum(r['latency_s'] for r in done) / len(done):.2f}s")
    bar.update()
    if INTERRUPT_REQUESTED.is_set():
        raise KeyboardInterrupt


def finish(run: RunPlan) -> dict[str, Any]:
    """The run's summary over its whole selection (the baseline comparison included), written
    beside its samples and logged."""
    wanted = {(r.id, k) for r in run.records for k in range(run.n_samples)}
    samples = [s for key, s in run.store.records.items() if key in wanted]
    summary = summarize_run(run.identity.config, run.method, samples, run.identity.comparison_root, run.identity)
    summary["skipped_context_overflow"] = len(wanted) - len(samples)  # on_overflow=skip (or no room left)
    # What this invocation's decode loop (grading and writing included) did per second of wall clock, loading,
    # warm-up and resumed samples excluded: the batching gain, unlike the batch-1 `latency_s`.
    decoded = [run.store.records[(str(r.id), k)] for r, k in run.todo if run.store.done(r.id, k)]
    wall = run.decode_wall_s
    rate = lambda n: n / wall if decoded and wall > 0 else None  # noqa: E731
    summary.update(decode_wall_s=wall if decoded else None, decoded_samples=len(decoded), samples_per_s=rate(len(decoded)),
                   decode_tokens_per_s=rate(sum(r["tokens"] for r in decoded)))
    summary.update(summarize_measurement(samples))
    run.store.write_summary(summary)
    if run.logger is not None:
        run.logger.finish(summary, samples)
    return summary


def evaluate(run: RunIdentity, logger=None) -> dict[str, Any]:
    """Make a run (`results.keys.identify`), resuming what its directory holds: plan, decode, finish."""
    with plan(run, logger) as planned:
        decode(planned)
        return finish(planned)


def run(cfg: dict[str, Any], run_dir: str | Path, logger=None) -> dict[str, Any]:
    """Evaluate one configuration (a resolved config dict) into `run_dir`, its speedup taken from the
    baseline run beside it (`run_dir`'s parent is its comparison directory)."""
    return evaluate(identify(cfg, Path(run_dir).parent, run_dir), logger)


def prepare_shapes(pair: ModelPair, batch_size: int, fitted: list[tuple[list[int], int]]) -> None:
    """After the warm-up decode, before any timed sample: a runner that captures a step per shape
    (the HF engine's CUDA graphs) captures every shape the run's samples (prompt, budget) can use."""
    lengths = [(len(ids), len(ids) + budget) for ids, budget in fitted]
    for model in pair.models().values():
        model.prepare_shapes(batch_size, min(n for n, _ in lengths), max(n for _, n in lengths))


def count(name: str, value: Any) -> int:
    """A count from a config (n_samples, max_new_tokens, ...), or one error line."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def run_config(cfg: dict[str, Any], logger=None) -> dict[str, Any]:
    """Run a composed config (see `config_groups.compose_config`) into its standard run directory,
    after its baseline when `baseline=auto` (`results.baseline.planned_runs`)."""
    runs = planned_runs({k: v for k, v in cfg.items() if k not in ("logger", "results_root")}, cfg["results_root"])
    return [evaluate(r, logger) for r in runs][-1]
