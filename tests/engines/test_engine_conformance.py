"""The engine contract (engines/base.py), run by every engine the registry holds (conf/engine/*.yaml).

Each engine's class declares how the contract loads it on the embedded testbed (`conformance`, a
tuple of `ConformanceEntry`); an engine that declares none fails here. Entries whose backend is
not installed skip, so each CI environment runs the engines it has (the HF engine always; vLLM and
llama.cpp in their own environments).

What every engine must do: partial prefill and rollback that equal a fresh forward of the same
tokens, distributions over the full vocabulary whose entropy is exact, batched forwards (the
scheduler's, `forward_batch`) that equal one-by-one forwards, also for a sequence that already
holds a cache when it joins a batch, the shared cost accounting, an identity and capabilities,
and one-line errors for what it cannot do.
"""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch

from rstitch.engines import ENGINES, Capabilities, engine_class, load_model, require
from rstitch.engines.base import ConformanceEntry
from rstitch.engines.batching import BatchScheduler
from rstitch.errors import ConfigError
from rstitch.testbed import LLM_DIR


@dataclass(frozen=True)
class EngineEntry:
    """One engine under test: its registry name, the model it loads, its options, the packages
    it needs (it skips without them), and how close its logits must come to the reference."""

    id: str
    engine: str
    path: str = str(LLM_DIR)
    options: dict[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    reference: str | None = str(LLM_DIR)  # a transformers checkpoint with the same weights (None: the engine's own logits)
    atol: float = 1e-4  # logits: this engine's incremental forwards against a fresh one, batched against alone
    max_kl: float | None = None  # instead of `atol`: KL(fresh || other) of the two distributions, in nats

    @classmethod
    def declared(cls, engine: str, entry: ConformanceEntry) -> EngineEntry:
        """The entry `engine`'s class declares, on the testbed's paths."""
        return cls(entry.id, engine, entry.path or str(LLM_DIR), dict(entry.options), entry.needs,
                   str(LLM_DIR) if entry.reference else None, entry.atol, entry.max_kl)

    def param(self) -> Any:
        missing = [p for p in self.needs if importlib.util.find_spec(p) is None]
        marks = [pytest.mark.skip(reason=f"needs {', '.join(missing)}")] if missing else []
        if self.needs:  # an optional backend loads a real model: the slow tier
            marks.append(pytest.mark.slow)
        return pytest.param(self, id=self.id, marks=marks)


ENGINE_LIST = [EngineEntry.declared(name, entry) for name in sorted(ENGINES) for entry in engine_class(name).conformance]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_registered_engine_declares_its_conformance_entries(engine):
    entries = engine_class(engine).conformance
    assert entries and all(isinstance(e, ConformanceEntry) for e in entries), (
        f"engine '{engine}' declares no conformance entry: set `conformance = (ConformanceEntry(...),)` on its class "
        "(how this contract loads it on the testbed; docs/adding-an-engine.md)")


def test_the_contract_runs_each_declared_entry_once():
    ids = [e.id for e in ENGINE_LIST]
    assert len(ids) == len(set(ids))
    assert {"hf-eager-cpu", "hf-static-cpu", "vllm", "llamacpp"} <= set(ids)


_LOADED: dict[str, Any] = {}


@pytest.fixture(params=[e.param() for e in ENGINE_LIST])
def entry(request) -> EngineEntry:
    return request.param


@pytest.fixture
def runner(entry):
    if entry.id not in _LOADED:
        _LOADED.clear()  # one engine's model at a time
        _LOADED[entry.id] = load_model(entry.engine, entry.path, **entry.options)
    return _LOADED[entry.id]


def prompt(runner, n: int, seed: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, runner.vocab_size, (n,), generator=gen).tolist()


def fresh_logits(runner, ids: list[int]) -> torch.Tensor:
    """The distribution after `ids` from a new sequence: one forward of all of them."""
    return runner.new_sequence(ids).next_distribution().logits


def distance(entry: EngineEntry, a: torch.Tensor, b: torch.Tensor) -> float:
    """How far logits `b` are from `a`: the largest difference, or KL(a || b) for a `max_kl` entry."""
    if entry.max_kl is None:
        return float((torch.log_softmax(a, -1) - torch.log_softmax(b, -1)).abs().max())
    log_a, log_b = torch.log_softmax(a.double(), -1), torch.log_softmax(b.double(), -1)
    return float((log_a.exp() * (log_a - log_b)).sum())


def bound(entry: EngineEntry) -> float:
    return entry.atol if entry.max_kl is None else entry.max_kl


def close(a: torch.Tensor, b: torch.Tensor, entry: EngineEntry) -> None:
    """Logits are a distribution's up to an additive constant (vLLM's verification rows come as
    log-probabilities, its next-token rows as raw logits), so they are compared as log-probabilities."""
    if entry.max_kl is None:
        torch.testing.assert_close(torch.log_softmax(a, -1), torch.log_softmax(b, -1), rtol=0, atol=entry.atol)
    else:
        assert distance(entry, a, b) <= entry.max_kl, f"KL {distance(entry, a, b):.2e} over {entry.max_kl}"


# --- identity and capabilities ---------------------------------------------------------------
def test_identity_and_capabilities_are_declared(entry, runner):
    identity = runner.identity
    assert identity.engine == entry.engine and identity.model == runner.name
    assert identity.device and identity.precision and "." not in identity.device + identity.precision
    assert isinstance(runner.capabilities, Capabilities)


# --- rollback and partial prefill ------------------------------------------------------------
def test_partial_prefill_equals_a_fresh_forward_and_books_only_new_tokens(entry, runner):
    ids = prompt(runner, 30)
    seq, processed = runner.new_sequence(ids[:8]), 0
    for end in (8, 9, 17, 30):  # a prompt, one token, then chunks
        seq.append(ids[len(seq):end])
        before = runner.cost.copy()
        logits = seq.next_distribution().logits
        spent = runner.cost.since(before)
        assert (spent.forward_calls, spent.tokens_processed) == (1, end - processed)  # only the uncached tokens ran
        close(logits, fresh_logits(runner, ids[:end]), entry)
        processed = end


def test_rollback_drops_tokens_and_reextending_gives_the_same_logits(entry, runner):
    ids = prompt(runner, 24, seed=1)
    seq = runner.new_sequence(ids[:10])
    first = [seq.next_distribution().logits]
    for token in ids[10:20]:
        seq.append(token)
        first.append(seq.next_distribution().logits)
    seq.rollback(7)  # outside the last forward's window: the cache is cut back
    assert seq.tokens == ids[:13]
    close(seq.next_distribution().logits, first[3], entry)
    seq.append(ids[20:24])  # a different continuation than before
    close(seq.next_distribution().logits, fresh_logits(runner, ids[:13] + ids[20:24]), entry)
    with pytest.raises(ValueError):
        seq.rollback(len(seq) + 1)


def test_score_gives_every_position_in_one_forward_and_rollback_inside_it_is_free(entry, runner):
    ids = prompt(runner, 20, seed=2)
    seq = runner.new_sequence(ids[:12])
    seq.next_distribution()
    calls = runner.cost.forward_calls
    dists = seq.score(ids[12:])
    assert runner.cost.forward_calls == calls + 1 and len(dists) == 9
    for i in (0, 4, 8):
        close(dists[i].logits, fresh_logits(runner, ids[: 12 + i]), entry)
    calls = runner.cost.forward_calls
    seq.rollback(3)
    assert torch.equal(seq.next_distribution().logits, dists[5].logits)
    assert runner.cost.forward_calls == calls  # the position's logits were kept


def test_the_tolerance_is_far_below_what_a_wrong_context_changes(entry, runner):
    """The logits checks above can fail: one token changed or left out of the context moves the
    next distribution by more than five times the entry's tolerance."""
    ids = prompt(runner, 20, seed=4)
    right = fresh_logits(runner, ids)
    changed = ids[:-3] + [(ids[-3] + 1) % runner.vocab_size] + ids[-2:]
    for wrong in (fresh_logits(runner, changed), fresh_logits(runner, ids[:-3] + ids[-2:])):
        assert distance(entry, right, wrong) > 5 * bound(entry)


# --- distributions -----------------------------------------------------------------------------
def test_entropy_is_exact_over_the_full_vocabulary(entry, runner):
    ids = prompt(runner, 16, seed=3)
    dists = runner.new_sequence(ids[:1]).score(ids[1:])
    reference = None
    if entry.reference is not None:  # the same weights through transformers, every position in one forward
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(entry.reference, dtype=torch.float32).eval()
        with torch.no_grad():
            reference = model(torch.tensor([ids])).logits[0, :, : runner.vocab_size].double()
    for i, dist in enumerate(dists):
        assert dist.logits.shape == (runner.vocab_size,)  # the full vocabulary, not a top-k
        logits = dist.logits.double() if reference is None else reference[i]
        log_p = torch.log_softmax(logits, -1)
        exact = float(-(log_p.exp() * log_p).sum())
        # Against its own logits the float32 sum over the vocabulary (151,936 terms on the real pair)
        # is the only error: up to 3e-4 nats measured; a top-k entropy would be off by far more.
        tol = 1e-3 if reference is None else 50 * entry.atol
        assert dist.entropy == pytest.approx(exact, abs=tol)
        assert dist.normalized_entropy == pytest.approx(exact / math.log(runner.vocab_size), abs=tol)
        assert float(dist.probs.sum()) == pytest.approx(1.0, abs=1e-5 + 1e-8 * runner.vocab_size)  # float32 over V terms


# --- batches ---------------------------------------------------------------------------------------
def batched(jobs: list, batch_size: int) -> dict:
    return {f.key: f.value for f in BatchScheduler(batch_size).run(jobs)}


def test_a_batch_decodes_what_each_sequence_decodes_alone_and_books_the_same_costs(entry, runner):
    prompts = [prompt(runner, n, seed=10 + n) for n in (5, 12, 3, 20)]

    def job(ids: list[int]):
        def decode() -> tuple[list[int], list[torch.Tensor], dict]:
            before = runner.cost.copy()
            seq = runner.new_sequence(ids)
            tokens, rows = [], []
            forced = prompt(runner, 6, seed=len(ids))
            for step in range(6):
                dist = seq.next_distribution()
                rows.append(dist.logits)
                tokens.append(dist.argmax)
                # greedy where the engine is exact; a KL-compared engine may break a near tie the
                # other way in another batch shape, so it is fed set tokens and compared on each row
                seq.append(tokens[-1] if entry.max_kl is None else forced[step])
                if step == 3:  # a rollback in the middle, then the same tokens again
                    appended = seq.tokens[-2:]
                    seq.rollback(2)
                    seq.append(appended)
            rows.append(seq.score(ids[:2])[-1].logits)  # a multi-token forward inside the batch
            return tokens, rows, runner.cost.since(before).as_dict()

        return decode

    alone = {i: job(p)() for i, p in enumerate(prompts)}
    together = batched([(i, job(p)) for i, p in enumerate(prompts)], batch_size=4)
    for i in alone:
        if entry.max_kl is None:
            assert together[i][0] == alone[i][0]
        for a, b in zip(together[i][1], alone[i][1]):
            close(a, b, entry)
        counts = {k: v for k, v in alone[i][2].items() if k != "forward_time_s"}
        assert {k: together[i][2][k] for k in counts} == counts  # each sample books its own forwards


def test_a_sequence_that_already_holds_a_cache_joins_a_batch(entry, runner):
    """A sequence decoded alone first (its cache filled outside any batch) and then continued in a
    batch beside new sequences gives the distributions of its twin that never joined one."""
    ids = prompt(runner, 40, seed=20)
    cached, twin = runner.new_sequence(ids[:17]), runner.new_sequence(ids[:17])
    for seq in (cached, twin):
        seq.next_distribution()
        seq.append(ids[17:19])
        seq.next_distribution()

    def continue_cached() -> list[torch.Tensor]:
        cached.append(ids[19:25])
        rows = [d.logits for d in cached.score(ids[25:27])]
        cached.append(ids[27])
        return rows + [cached.next_distribution().logits]

    def fresh(n: int):
        return lambda: runner.new_sequence(ids[:n]).next_distribution().logits

    together = batched([("cached", continue_cached), ("fresh-5", fresh(5)), ("fresh-9", fresh(9))], batch_size=3)
    twin.append(ids[19:25])
    expected = [d.logits for d in twin.score(ids[25:27])]
    twin.append(ids[27])
    expected.append(twin.next_distribution().logits)
    for got, want in zip(together["cached"], expected):
        close(got, want, entry)
    close(together["fresh-9"], fresh_logits(runner, ids[:9]), entry)


# --- cost accounting ---------------------------------------------------------------------------------
def test_costs_count_prefill_tokens_decode_steps_and_forward_shapes(entry, runner):
    ids = prompt(runner, 12, seed=30)
    before = runner.cost.copy()
    runner.cost.forward_shapes.clear()
    seq = runner.new_sequence(ids[:8])
    seq.next_distribution()  # a prefill of 8
    seq.append(ids[8])
    seq.next_distribution()  # a decode step over 8 cached tokens
    seq.append(ids[9:12])
    seq.next_distribution()  # a prefill of 3 over 9
    spent = runner.cost.since(before)
    assert (spent.prefill_tokens, spent.decode_steps, spent.forward_calls) == (11, 1, 3)
    assert spent.forward_time_s > 0
    assert runner.cost.forward_shapes == [(8, 0), (1, 8), (3, 9)]


# --- what an engine cannot do: one line ---------------------------------------------------------------
def test_what_an_engine_cannot_do_is_one_error_line(entry, runner, monkeypatch):
    with pytest.raises(ConfigError) as err:
        load_model(entry.engine, entry.path, no_such_option=1)
    assert "\n" not in str(err.value) and entry.engine in str(err.value)
    # Each capability: refused in one line where it is missing (declared so, or switched off here).
    for capability in Capabilities.DESCRIPTIONS:
        off = replace(runner.capabilities, **{capability: False})
        monkeypatch.setattr(runner, "capabilities", off)
        with pytest.raises(ConfigError) as err:
            require(runner, capability, "this test")
        assert "\n" not in str(err.value) and f"engine '{entry.engine}'" in str(err.value)
    monkeypatch.setattr(runner, "capabilities", replace(runner.capabilities, hidden_states=False))
    with pytest.raises(ConfigError) as err:
        runner.new_sequence([3, 4], want_hidden=True)
    assert "\n" not in str(err.value)
