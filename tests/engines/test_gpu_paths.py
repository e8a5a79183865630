"""Device placement of everything methods do with an engine's outputs, checked without a GPU.

The logits and hidden states an engine returns are wrapped in `OnAccelerator`, a CPU tensor that
reports a CUDA device and refuses what CUDA refuses: a CPU generator drawing from it, arithmetic
with a CPU tensor of one or more dimensions, conversion to NumPy. Every method of conf/method then
runs sampled (and greedy) on the testbed through the runner: a method that would crash on a GPU
("Expected a 'cuda' device type for generator but found 'cpu'") fails here. The `gpu` tests
repeat the sampled runs on a real CUDA device and compare their tokens with the CPU's.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from rstitch.cli.run import CONF_DIR, compose_config
from rstitch.engines import Sampler
from rstitch.engines.hf import HFModelRunner, HFSequence
from rstitch.runner import run

METHODS = sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))
FEWER_CANDIDATES = {"best_of_n": ["method.n=2"], "maj": ["method.n=2"], "process_bon": ["method.n=2"],
                    "beam_search": ["method.beam_size=2", "method.expansions=2"]}
FAKE_DEVICE = torch.device("cuda", 0)
# Indexing with CPU indices and copying across devices are allowed on CUDA.
CROSS_DEVICE_OK = {torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.copy_}


class OnAccelerator(torch.Tensor):
    """A CPU tensor standing in for one on a CUDA device, for device checks on a CPU machine."""

    @property  # type: ignore[override]  # what code reads; torch's kernels still see the CPU
    def device(self) -> torch.device:
        return FAKE_DEVICE

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        kwargs = kwargs or {}
        generator = kwargs.get("generator")
        if generator is not None and generator.device.type != "cuda":
            raise RuntimeError(f"Expected a 'cuda' device type for generator but found '{generator.device.type}'")
        if func in (torch.Tensor.numpy, torch.Tensor.__array__):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() first.")
        if func in (torch.Tensor.cpu, torch.Tensor.to):
            return _moved(func, args, kwargs)
        if func not in CROSS_DEVICE_OK and any(_is_host_tensor(a) for a in _flat(args, kwargs)):
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")
        return super().__torch_function__(func, types, args, kwargs)


def _moved(func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """`.cpu()` / `.to(...)`: a plain tensor when it leaves for the host, still on the fake device otherwise."""
    with torch._C.DisableTorchFunctionSubclass():
        target = [a for a in (*args[1:], kwargs.get("device")) if isinstance(a, (str, torch.device))]
        leaves = func is torch.Tensor.cpu or any(torch.device(t).type == "cpu" for t in target)
        clean = {k: ("cpu" if k == "device" else v) for k, v in kwargs.items()}
        plain_args = tuple("cpu" if isinstance(a, (str, torch.device)) else a for a in args)
        out = func(*plain_args, **clean)
    return out.as_subclass(torch.Tensor) if leaves else out.as_subclass(OnAccelerator)


class FactoriesOnAccelerator(TorchFunctionMode):
    """Tensors made with `device=<the fake device>` (e.g. `torch.arange(n, device=probs.device)`)
    are made on the CPU and handed back as `OnAccelerator`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            out = func(*args, **{**kwargs, "device": "cpu"})
            return out.as_subclass(OnAccelerator) if isinstance(out, torch.Tensor) else out
        return func(*args, **kwargs)


def _flat(args: tuple, kwargs: dict) -> list[Any]:
    out: list[Any] = []
    for a in (*args, *kwargs.values()):
        out.extend(a if isinstance(a, (list, tuple)) else [a])
    return out


def _is_host_tensor(value: Any) -> bool:
    return type(value) is torch.Tensor and value.ndim > 0


def on_accelerator(output: tuple[torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits, hidden = output
    return logits.as_subclass(OnAccelerator), None if hidden is None else hidden.as_subclass(OnAccelerator)


@pytest.fixture
def engine_on_fake_cuda(monkeypatch):
    """The HF engine's outputs (batch 1 and batched) handed to methods as if on a GPU."""
    forward, forward_batch = HFSequence._forward, HFModelRunner.forward_batch
    monkeypatch.setattr(HFSequence, "_forward", lambda self, ids, keep: on_accelerator(forward(self, ids, keep)))
    monkeypatch.setattr(HFModelRunner, "forward_batch",
                        lambda self, requests: [on_accelerator(o) for o in forward_batch(self, requests)])
    with FactoriesOnAccelerator():
        yield


def test_the_fake_device_refuses_what_cuda_refuses():
    probs = torch.full((4,), 0.25).as_subclass(OnAccelerator)
    assert probs.device == FAKE_DEVICE
    with pytest.raises(RuntimeError, match="generator"):
        torch.multinomial(probs, 1, generator=torch.Generator())
    with pytest.raises(RuntimeError, match="same device"):
        probs * torch.arange(4.0)
    assert type(probs.cpu()) is torch.Tensor and type(probs.to("cpu")) is torch.Tensor
    assert type(probs * 2) is OnAccelerator and float((probs * torch.tensor(2.0)).sum()) == 2.0
    with FactoriesOnAccelerator():
        assert float((probs * torch.arange(4.0, device=probs.device)).sum()) == 1.5


def test_sampler_draws_on_the_host_the_same_tokens_from_any_device():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    sampler = Sampler(temperature=0.7, top_p=0.9, seed=5)
    again = Sampler(temperature=0.7, top_p=0.9, seed=5)
    on_host = [sampler.sample_from(sampler.probs_from_logits(logits)) for _ in range(20)]
    elsewhere = [again.sample_from(again.probs_from_logits(logits.as_subclass(OnAccelerator))) for _ in range(20)]
    assert on_host == elsewhere and len(set(on_host)) > 1
    # the CPU stream is the one draws always came from: torch.multinomial with the seeded CPU generator
    reference = torch.Generator().manual_seed(5)
    probs = Sampler(temperature=0.7, top_p=0.9).probs_from_logits(logits)
    assert on_host == [int(torch.multinomial(probs, 1, generator=reference)) for _ in range(20)]


def _config(tmp_path: Path, *overrides: str) -> dict:
    cfg = compose_config(["logger=none", f"results_root={tmp_path}", "engine.num_threads=1", *overrides])
    cfg.pop("logger")
    cfg.pop("results_root")
    return cfg


def _tokens(run_dir: Path) -> list[list[int]]:
    return [json.loads(line)["output_token_ids"] for line in (run_dir / "samples.jsonl").read_text().splitlines()]


# Options whose code paths touch the engine's outputs differently from the defaults.
VARIANTS = {"specreason-expected": ["method=specreason", "method.score_mode=expected"]}


@pytest.mark.parametrize("temperature", [0.7, pytest.param(0.0, marks=pytest.mark.slow)])
@pytest.mark.parametrize("method", [*METHODS, *VARIANTS])
def test_every_method_keeps_the_engine_outputs_on_their_device(tmp_path, engine_on_fake_cuda, method, temperature):
    if method == "arbitrage":
        pytest.skip("needs a trained router checkpoint (method.router)")
    common = [*VARIANTS.get(method, [f"method={method}"]), "dataset.limit=1", "max_new_tokens=24",
              f"decoding.temperature={temperature}", *FEWER_CANDIDATES.get(method, [])]
    summary = run(_config(tmp_path, *common), tmp_path / "run")
    assert summary["decoded_samples"] == 1 and summary.get("failed_samples", 0) == 0


@pytest.mark.parametrize("method", ["maj", "rstitch", "specdec"])
def test_batched_runs_keep_the_engine_outputs_on_their_device(tmp_path, engine_on_fake_cuda, method):
    common = [f"method={method}", "dataset.limit=2", "n_samples=2", "max_new_tokens=16", "decoding.temperature=0.7",
              "batch_size=4", *FEWER_CANDIDATES.get(method, [])]
    summary = run(_config(tmp_path, *common), tmp_path / "run")
    assert summary["decoded_samples"] == 4


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["maj", "best_of_n", "process_bon", "beam_search", "specreason", "rsd", "specdec"])
def test_sampled_methods_run_on_cuda(tmp_path, method):
    common = [f"method={method}", "dataset.limit=2", "max_new_tokens=24", "decoding.temperature=0.7",
              *FEWER_CANDIDATES.get(method, [])]
    cuda = run(_config(tmp_path, *common, "pair.device=cuda"), tmp_path / "cuda")
    assert cuda["decoded_samples"] == 2
    cpu = run(_config(tmp_path, *common), tmp_path / "cpu")
    # float32 on both: equal probabilities give equal draws; a near-tie of the kernels may differ late
    same = sum(a == b for a, b in zip(_tokens(tmp_path / "cuda"), _tokens(tmp_path / "cpu")))
    assert cpu["decoded_samples"] == 2 and same >= 1


@pytest.mark.gpu
def test_one_seed_draws_the_same_tokens_on_cuda_and_cpu():
    logits = torch.randn(152064, generator=torch.Generator().manual_seed(0))
    draws = {}
    for device in ("cpu", "cuda"):
        sampler = Sampler(temperature=0.6, top_p=0.95, seed=9)
        probs = sampler.probs_from_logits(logits.to(device))
        draws[device] = [sampler.sample_from(probs) for _ in range(50)]
    # the probabilities are computed on each device; where they are equal the draws are too
    assert sum(a == b for a, b in zip(draws["cpu"], draws["cuda"])) >= 45


# --- latency estimates ---------------------------------------------------------------------
def test_a_latency_fit_that_extrapolates_below_zero_is_refused_with_one_line(tmp_path):
    from rstitch.engines import load_pair
    from rstitch.errors import ConfigError
    from rstitch.latency.model import LatencyModel, latency_file, load_pair_latency, runner_identity
    from rstitch.testbed import ASSETS_DIR, LLM_DIR, SLM_DIR

    testbed_pair = load_pair({"path": str(SLM_DIR), "name": "testbed-slm"}, {"path": str(LLM_DIR), "name": "testbed-llm"})

    shipped = load_pair_latency(ASSETS_DIR / "latency", testbed_pair)
    assert shipped is not None and set(shipped) == {"slm", "llm"}  # the shipped fits are positive everywhere
    # 4 decode points whose time falls with the cache (noise on a GPU): today's fit keeps every cost >= 0,
    # but a profile saved by an older fit holds the falling line, which crosses zero at n_kv ~ 8k
    for runner in testbed_pair.models().values():
        fit = LatencyModel.fit([1, 1, 1, 1], [0, 256, 512, 768], [0.0100, 0.0097, 0.0094, 0.0091],
                               model=runner.name, device="cpu", dtype="float32")
        assert min(fit.a, fit.b, fit.c, fit.d) >= 0
        dataclasses.replace(fit, a=-1.2e-6).save(latency_file(tmp_path, *runner_identity(runner)))
    with pytest.raises(ConfigError) as err:
        load_pair_latency(tmp_path, testbed_pair)
    message = str(err.value)
    assert "\n" not in message and "testbed-slm.cpu.float32.json" in message and "predicts -" in message
    assert "python scripts/profile_latency.py --max-inf 4096 --max-kv 32768" in message
    assert load_pair_latency(tmp_path, testbed_pair, max_kv=4096) is not None  # positive over a shorter range
