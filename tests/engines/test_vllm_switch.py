"""The switch processors against vLLM's own interfaces, without an engine: the V2 model runner's
loader and validator accept `SwitchProcessorV2`; a step decides on the device (it runs on `meta`
tensors, which have no values to read, and on the CPU under a dispatch mode that fails any read
of a tensor value on the host); and its decisions are the rule's, computed here by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import (  # noqa: E402
    LogitsContext,
    LogitsProcRequestState,
    build_custom_logits_processors_params_validator,
)
from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs  # noqa: E402

from rstitch.engines import vllm_switch  # noqa: E402
from rstitch.engines.vllm_switch import KEY, SwitchProcessorV2, forced, new_serial  # noqa: E402

VOCAB, PADDED, SENTINEL = 12, 16, 15  # a model vocabulary with padding ids beyond the shared one


def rule(tau: float | None, stop_above: bool, keep_last: bool) -> dict:
    return {"serial": new_serial(), "vocab": VOCAB, "sentinel": SENTINEL, "tau": tau, "stop_above": stop_above,
            "keep_last": keep_last}


def params(switch: dict | None, temperature: float = 0.0, seed: int | None = None) -> SamplingParams:
    return SamplingParams(temperature=temperature, seed=seed, extra_args=None if switch is None else {KEY: switch})


def processor(device: str, slots: int = 8) -> SwitchProcessorV2:
    states = LogitsProcRequestState(device=torch.device(device), max_num_reqs=slots, vocab_size=PADDED,
                                    all_token_ids=None, prompt_len=None, prefill_len=None, total_len=None)
    return SwitchProcessorV2(None, states)


def context(slots: list[int], positions: list[int], device: str) -> LogitsContext:
    mapping = torch.tensor(slots, dtype=torch.int32, device=device)
    return LogitsContext(expanded_idx_mapping=mapping, idx_mapping=mapping, idx_mapping_np=np.array(slots),
                         expanded_local_pos=torch.zeros_like(mapping), input_ids=torch.zeros_like(mapping),
                         pos=torch.tensor(positions, device=device) - 1, seq_lens_upper_bound_np=np.array(positions))


def test_v2_loader_and_validator_accept_the_processor():
    fqcn = "rstitch.engines.vllm_switch:SwitchProcessorV2"
    assert _load_v2_logitsprocs([SwitchProcessorV2, fqcn]) == [SwitchProcessorV2, SwitchProcessorV2]
    validate = build_custom_logits_processors_params_validator((SwitchProcessorV2,))
    validate(params(rule(0.02, True, False)))
    validate(params(None))
    with pytest.raises(VLLMValidationError, match="tau"):
        validate(params({**rule(0.02, True, False), "tau": "high"}))


class HostReads(TorchDispatchMode):
    """Fails at any op that reads a tensor value on the host or copies between devices."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            raise AssertionError(f"host read: {func}")
        devices = {a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
        if "device" in kwargs and kwargs["device"] is not None:
            devices.add(torch.device(kwargs["device"]))
        if len(devices) > 1:
            raise AssertionError(f"cross-device op: {func} on {devices}")
        return func(*args, **kwargs)


def admit(proc: SwitchProcessorV2, rules: list[tuple[dict | None, float]]) -> None:
    for slot, (switch, temperature) in enumerate(rules):
        proc.add_request(slot, params(switch, temperature))
    proc.apply_staged_writes()


MIXED = [(rule(0.02, True, False), 0.0), (rule(0.5, False, True), 0.0), (None, 0.0), (rule(0.5, False, True), 0.8),
         (rule(None, True, False), 0.0)]


def test_a_step_runs_on_meta_tensors():
    """Meta tensors hold no values: `.item()`, `.tolist()` or a Python-list index of their
    values fails, so a step that passes reads nothing on the host."""
    proc = processor("meta")
    admit(proc, MIXED)
    logits = torch.empty((5, PADDED), device="meta")
    ctx = context([0, 1, 2, 3, 4], [10, 11, 12, 13, 14], "meta")
    with HostReads():  # and no host tensor (a Python list made an index) meets a device one
        assert proc.apply(logits, ctx).shape == (5, PADDED)


def test_a_step_reads_no_value_on_the_host():
    proc = processor("cpu")
    admit(proc, MIXED)
    logits = torch.randn(5, PADDED)
    with HostReads():
        proc.apply(logits, context([3, 0, 2, 1, 4], [10, 11, 12, 13, 14], "cpu"))
    with pytest.raises(AssertionError, match="host read"), HostReads():
        torch.ones(2).sum().item()  # the mode does catch host reads


def normalized_entropy(row: torch.Tensor) -> float:
    log_probs = torch.log_softmax(row[:VOCAB], -1)
    return float(-(log_probs.exp() * log_probs).sum() / math.log(VOCAB))


@pytest.mark.parametrize("stop_above, keep_last", [(True, False), (False, True), (True, True), (False, False)])
def test_decisions_follow_the_rule(stop_above, keep_last):
    torch.manual_seed(0)
    proc = processor("cpu")
    rows = torch.randn(6, PADDED) * torch.tensor([0.1, 0.5, 1, 2, 4, 8])[:, None]  # entropies from high to low
    entropies = [normalized_entropy(r) for r in rows]
    tau = sorted(entropies)[2] + 1e-4
    rules = [rule(tau, stop_above, keep_last) for _ in rows]
    admit(proc, [(r, 0.0) for r in rules])
    logits = rows.clone()
    positions = list(range(20, 26))
    proc.apply(logits, context(list(range(6)), positions, "cpu"))
    for i, (row, h, r) in enumerate(zip(rows, entropies, rules)):
        crossed = h > tau if stop_above else h <= tau
        if crossed:
            assert logits[i].argmax() == SENTINEL and torch.isinf(logits[i]).sum() == PADDED - 1
            assert forced(r["serial"], positions[i]) == (True, int(row[:VOCAB].argmax()) if keep_last else -1)
        else:
            assert torch.equal(logits[i, :VOCAB], row[:VOCAB]) and torch.isinf(logits[i, VOCAB:]).all()
            assert forced(r["serial"], positions[i]) == (False, -1)
    assert {h > tau for h in entropies} == {True, False}  # both outcomes were seen


def test_rows_without_a_rule_are_untouched_and_no_rule_only_masks():
    proc = processor("cpu")
    admit(proc, [(None, 0.0), (rule(None, True, False), 0.0)])
    rows = torch.randn(2, PADDED)
    logits = rows.clone()
    proc.apply(logits, context([0, 1], [5, 5], "cpu"))
    assert torch.equal(logits[0], rows[0])
    assert torch.equal(logits[1, :VOCAB], rows[1, :VOCAB]) and torch.isinf(logits[1, VOCAB:]).all()


def test_a_discarded_step_at_the_same_position_is_overwritten_and_a_later_one_is_ignored():
    """A chunked prefill's discarded sample runs again at the same position: its record goes
    when the step that counts does not cross. A step run after the stop (async scheduling)
    never replaces the forced one."""
    proc = processor("cpu")
    r = rule(0.5, True, False)
    admit(proc, [(r, 0.0)])
    flat, peaked = torch.zeros(1, PADDED), torch.tensor([[30.0] + [0.0] * (PADDED - 1)])
    proc.apply(flat.clone(), context([0], [7], "cpu"))
    assert forced(r["serial"], 7) == (True, -1)
    proc.apply(peaked.clone(), context([0], [7], "cpu"))
    assert forced(r["serial"], 7) == (False, -1)
    proc.apply(flat.clone(), context([0], [8], "cpu"))
    proc.apply(flat.clone(), context([0], [9], "cpu"))
    assert forced(r["serial"], 8) == (True, -1) and forced(r["serial"], 9) == (False, -1)


def test_sampled_keep_rule_draws_from_the_tempered_top_p_distribution():
    """The kept token of a sampled run is a draw: over many steps its frequencies follow the
    temperature-scaled distribution (top-p 1 here)."""
    proc = processor("cpu", slots=1)
    base = torch.tensor([2.0, 1.0, 0.0] + [-30.0] * (PADDED - 3))
    expected = torch.softmax(base[:3] / 0.7, -1)
    counts = torch.zeros(3)
    for step in range(600):
        r = rule(0.9, False, True)  # always crosses: the distribution is peaked
        admit(proc, [(r, 0.7)])
        proc.apply(base.clone()[None], context([0], [step], "cpu"))
        hit, kept = forced(r["serial"], step)
        assert hit and kept < 3
        counts[kept] += 1
    assert torch.allclose(counts / counts.sum(), expected, atol=0.06)
    assert vllm_switch.LOG_SIZE > 600


@pytest.mark.parametrize("setting, expected", [("1", "SwitchProcessorV2"), ("0", "SwitchProcessor"), (None, None)])
def test_the_engine_registers_the_processor_of_the_runner_vllm_picks(monkeypatch, setting, expected):
    """vLLM's choice: the environment's, else V2 wherever Triton has a backend (not on a CPU)."""
    from vllm import envs
    from vllm.triton_utils import HAS_TRITON

    envs.disable_envs_cache()  # an engine started earlier in this process froze the environment it read

    from rstitch.engines.vllm import _v2_runner_expected, switch_processor

    if setting is None:
        monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
        expected = "SwitchProcessorV2" if HAS_TRITON else "SwitchProcessor"
    else:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", setting)
    assert switch_processor(_v2_runner_expected()).__name__ == expected


def kept_draw(seed: int, position: int) -> int:
    proc = processor("cpu", slots=1)
    r = rule(0.9, True, True)  # a flat row's entropy (1) is above 0.9: it crosses
    proc.add_request(0, params(r, 1.0, seed))
    proc.apply_staged_writes()
    proc.apply(torch.zeros(1, PADDED), context([0], [position], "cpu"))  # flat: every token as likely
    hit, kept = forced(r["serial"], position)
    assert hit
    return kept


def test_a_sampled_kept_token_depends_only_on_the_seed_and_the_position():
    assert [kept_draw(7, 30) for _ in range(3)] == [kept_draw(7, 30)] * 3
    assert len({kept_draw(seed, 30) for seed in range(12)}) > 3 and len({kept_draw(7, p) for p in range(12)}) > 3


def test_captured_rows_stay_on_the_device_raw_and_keyed_by_position():
    """A scoring request's rows are kept as device tensors (here `meta`, which holds no values:
    nothing is read on the host) and, on the CPU, equal the raw logits cut to the vocabulary,
    taken before a rule of another row edits the logits in place."""
    for device in ("meta", "cpu"):
        proc = processor(device)
        serial = new_serial()
        proc.add_request(0, params(rule(0.0, True, False)))  # crosses at once: its row is forced
        proc.add_request(1, SamplingParams(temperature=0.0, extra_args={vllm_switch.CAPTURE_KEY: {"serial": serial, "vocab": VOCAB}}))
        proc.apply_staged_writes()
        logits = torch.randn(2, PADDED) if device == "cpu" else torch.empty((2, PADDED), device="meta")
        raw = logits.clone()
        with HostReads():
            proc.apply(logits, context([1, 0], [20, 30], device))
        rows = vllm_switch.captured(serial)
        assert list(rows) == [20] and rows[20].device == torch.device(device) and rows[20].shape == (VOCAB,)
        if device == "cpu":
            assert torch.equal(rows[20], raw[0, :VOCAB]) and vllm_switch.captured(serial) == {}
    with pytest.raises(VLLMValidationError, match="serial"):
        build_custom_logits_processors_params_validator((SwitchProcessorV2,))(
            SamplingParams(extra_args={vllm_switch.CAPTURE_KEY: {"serial": "x", "vocab": VOCAB}}))


def test_v2_prompt_rows_are_kept_on_the_device_by_position():
    """The V2 runner's prompt-row component, given the row keeping (`vllm_rows`), keeps the rows
    of a capturing request's prompt positions from `prompt_from` on, computed with the runner's
    logits function on the step's hidden states (a chunk of the prompt here, beside a request
    that wants none): on `meta` tensors and on the CPU under the host-read check, equal there to
    the logits computed by hand; vLLM's own prompt logprobs are untouched (none asked)."""
    from types import SimpleNamespace

    from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker

    from rstitch.engines import vllm_rows

    hidden_size = 4
    for device in ("meta", "cpu"):
        weight = torch.randn(hidden_size, PADDED).to(device)
        component = PromptLogprobsWorker(4, torch.device(device))
        assert vllm_rows.keep_prompt_rows(SimpleNamespace(model_runner=SimpleNamespace(prompt_logprobs_worker=component))) == "v2"
        serial = new_serial()
        capture = {"serial": serial, "vocab": VOCAB, "prompt_from": 9}
        component.add_request("a", 2, SamplingParams(extra_args={vllm_switch.CAPTURE_KEY: capture}))
        component.add_request("b", 0, SamplingParams())
        # Slot 2 computes positions 6..11 of a 12-token prompt (rows 3..8), slot 0 three tokens (rows 0..2).
        batch = SimpleNamespace(req_ids=["b", "a"], idx_mapping_np=np.array([0, 2]), query_start_loc_np=np.array([0, 3, 9]),
                                num_computed_prefill_tokens_np=np.array([20, 6]))
        hidden = torch.randn(9, hidden_size).to(device)
        with HostReads():
            out = component.compute_prompt_logprobs(weight.__rmatmul__, hidden, batch, None, None, np.array([21, 0, 12, 0]))
        rows = vllm_switch.captured(serial)
        # Positions 6..10 predict tokens 7..11; kept from 9 to the prompt's last token (11).
        assert out == {} and sorted(rows) == [9, 10, 11]
        assert all(r.device == torch.device(device) and r.shape == (VOCAB,) for r in rows.values())
        if device == "cpu":
            for position, row in rows.items():
                assert torch.allclose(row, (hidden[3 + position - 7] @ weight)[:VOCAB])
