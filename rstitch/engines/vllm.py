"""vLLM backend: every model is its own `vllm.LLM` engine in this process (docs/vllm.md, "Design")."""
from __future__ import annotations

import bisect
import math
import os
from collections.abc import Callable, Collection, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import torch

from rstitch.engines import vllm_memory
from rstitch.engines.base import (
    Capabilities,
    ConformanceEntry,
    EngineIdentity,
    ForwardRequest,
    Generation,
    ModelRunner,
    Sequence,
    SwitchRule,
    resolve_model_path,
    torch_dtype,
)
from rstitch.engines.loading import (
    count_parameters,
    eos_token_ids,
    generation_eos,
    load_config,
    load_tokenizer,
    model_load_errors,
    model_name,
    run_model_specs,
    shared_vocab_size,
)
from rstitch.engines.sampling import Sampler
from rstitch.errors import ConfigError

FULL_VOCAB_LIMIT = 4096  # `logprobs: auto` returns the full vocabulary up to this size...
AUTO_TOPK = 20  # ...and the top 20 above it (vLLM's default cap, the OpenAI API's maximum)


def complete_topk(token_ids: torch.Tensor, logprobs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A full log-probability row: the mass the listed tokens leave spread evenly over the others."""
    row = torch.full((vocab_size,), float("nan"))
    inside = token_ids < vocab_size
    row[token_ids[inside]] = logprobs[inside].float()
    unlisted = row.isnan()
    n_unlisted = int(unlisted.sum())
    if n_unlisted:
        listed_mass = float(row[~unlisted].exp().sum())
        rest = max(1.0 - listed_mass, 1e-30)
        row[unlisted] = math.log(rest / n_unlisted)
    return row


class VLLMSequence(Sequence):
    runner: VLLMModelRunner

    def __init__(self, runner: VLLMModelRunner, prompt_ids: Seq[int], want_hidden: bool = False):
        super().__init__(runner, prompt_ids, want_hidden)
        if want_hidden:
            runner.open_hidden_engine()  # fail (or pay the load) before the first forward
        # The last request's rows: row i follows _path[: _first + i + 1] (_hidden: its hidden states).
        self._path: list[int] = []
        self._decoded: list[int] = []  # the last request's tokens and all it generated
        self._requested = self._served_calls = 0  # its token count; calls served from it since
        self._first = 0
        self._rows: torch.Tensor | None = None
        self._hidden: torch.Tensor | None = None
        self._lookahead = 1
        self._dropped_at: int | None = None  # the position a dropped run's last forward computed

    def _forward(self, new_ids: list[int], keep: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.runner.forward_batch([ForwardRequest(self.runner, self, list(new_ids), keep)])[0]

    def _crop(self, n_keep: int) -> None:
        """Nothing to free: vLLM's prefix cache is shared and evicts by itself."""

    def _stored(self, tokens: list[int], keep: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The rows of the last `keep` positions of `tokens`, if the last request covered them."""
        first = len(tokens) - keep
        if self._rows is None or first < self._first or tokens != self._path[: len(tokens)]:
            return None
        rows = slice(first - self._first, len(tokens) - self._first)
        return self._rows[rows], None if self._hidden is None else self._hidden[rows]

    def _adapt_lookahead(self, tokens: list[int]) -> None:
        """Double the lookahead when the caller took every token of the last one, else back to one:
        a wasted token costs about as much as the request it would save."""
        n_generated = len(self._decoded) - self._requested
        took_all = (len(tokens) >= len(self._decoded) > 0 and self._served_calls >= n_generated - 1
                    and tokens[: len(self._decoded)] == self._decoded)
        self._lookahead = min(2 * self._lookahead, self.runner.max_lookahead) if took_all else 1

    def _store(self, tokens: list[int], keep: int, out: Any, serial: int) -> None:
        """Keep a scoring request's rows: the last `keep` positions of `tokens` and its greedy tokens'."""
        runner = self.runner
        generated = list(out.outputs[0].token_ids)
        rows = runner.scoring_rows(out, serial, len(tokens), keep, len(generated))
        self._decoded = tokens + generated
        self._requested, self._served_calls = len(tokens), 0
        self._path = self._decoded[:-1]
        self._first = len(tokens) - keep
        self._rows = torch.stack([r.to(rows[-1].device) for r in rows])
        if self.want_hidden:  # the states at the same positions: one pooling request on the path
            self._hidden = runner.hidden_states(self._path, len(rows))
        runner.lookahead_tokens += len(generated) - 1

    def decode_until(
        self,
        max_new_tokens: int,
        sampler: Sampler,
        rule: SwitchRule,
        stop: Seq[str] = (),
        eos_ids: Collection[int] | None = None,
    ) -> Generation:
        """One vLLM request for the whole run (docs/vllm.md); tokens and cost books are the base loop's."""
        if max_new_tokens <= 0:
            return Generation([], "length")
        runner = self.runner
        if rule.ends and not runner.switch_in_engine:
            return super().decode_until(max_new_tokens, sampler, rule, stop, eos_ids)
        eos = set(runner.eos_token_ids if eos_ids is None else eos_ids)
        result, seconds = runner.run_request(RunRequest(self, max_new_tokens, sampler, rule, list(stop), eos))
        self._book_run(len(result.token_ids) + result.dropped, seconds)
        self.append(result.token_ids)
        # As after the loop: the last token is pending, unless a dropped position's forward processed all.
        self.n_cached = len(self.tokens) - (0 if result.dropped else 1)
        self._window_logits = self._window_hidden = None
        # The loop would hold that distribution in its window: a run asked again there books no forward for it.
        self._dropped_at = len(self.tokens) if result.dropped else None
        return result

    def _book_run(self, n_forwards: int, seconds: float) -> None:
        """The base loop's forwards: the pending tokens (or the last one again unless still in the
        window), then one decode step per further distribution."""
        forwards: list[tuple[int, int]] = []
        held = self._window_covers(len(self.tokens) - 1) or self._dropped_at == len(self.tokens)
        if not (self.n_pending == 0 and held):
            pending = max(self.n_pending, 1)
            forwards.append((pending, len(self.tokens) - pending))
        forwards += [(1, len(self.tokens) + i) for i in range(n_forwards - 1)]
        for n_tokens, n_kv in forwards:
            self.runner.cost.add_forward(n_tokens, seconds / len(forwards), n_kv)


@dataclass
class RunRequest:
    """A run of tokens (`decode_until`) waiting for this model's next `generate` call."""

    seq: VLLMSequence
    max_new_tokens: int
    sampler: Sampler
    rule: SwitchRule
    stop: list[str]
    eos: set[int]

    @property
    def runner(self) -> VLLMModelRunner:  # the model whose round it waits for (engines/batching.py)
        return self.seq.runner


class _Scoring:
    """A forward as vLLM requests: served from the lookahead, or one request that reads the prefix
    cache unless it holds a wanted position (repeated without it if the cache grew meanwhile)."""

    def __init__(self, seq: VLLMSequence, new_ids: list[int], keep: int):
        self.seq, self.keep = seq, keep
        self.tokens = seq.tokens[: seq.n_cached] + new_ids
        self.result = seq._stored(self.tokens, keep)
        if self.result is not None:
            seq.runner.served_from_lookahead += 1
            seq._served_calls += 1
            return
        seq._adapt_lookahead(self.tokens)
        self.lookahead = seq.runner.room(len(self.tokens), seq._lookahead)
        read_cache = keep <= 1 or cached_tokens(seq.runner.llm, self.tokens) <= len(self.tokens) - keep
        self.serial = seq.runner.vllm_switch.new_serial()
        self.params = seq.runner.scoring_params(self.lookahead, keep, read_cache, self.serial, len(self.tokens))

    def take(self, out: Any) -> None:
        runner = self.seq.runner
        if self.keep > 1 and out.num_cached_tokens > len(self.tokens) - self.keep:
            # The cache held positions whose prompt logprobs were wanted: recompute them.
            runner.prefix_cache_retries += 1
            runner.vllm_switch.captured(self.serial)  # drop this request's kept rows
            self.serial = runner.vllm_switch.new_serial()
            self.params = runner.scoring_params(self.lookahead, self.keep, False, self.serial, len(self.tokens))
            return
        self.seq._store(self.tokens, self.keep, out, self.serial)
        self.result = self.seq._stored(self.tokens, self.keep)


class _Run:
    """A `RunRequest` as vLLM requests: one, and another after each sentinel the model sampled itself."""

    def __init__(self, request: RunRequest):
        self.request = request
        self.out: list[int] = []
        self.result: Generation | None = None
        self._next()

    def _next(self) -> None:
        r, runner = self.request, self.request.seq.runner
        self.tokens = r.seq.tokens + self.out
        left = r.max_new_tokens - len(self.out)
        # A kept crossing token takes the forced sentinel's place: no room beyond the budget.
        self.serial = runner.vllm_switch.new_serial()
        self.params = runner.run_params(runner.room(len(self.tokens), left), r.sampler, r.stop, r.eos, r.rule,
                                        self.serial)

    def take(self, out: Any) -> None:
        r, sentinel = self.request, self.request.seq.runner.sentinel
        completion = out.outputs[0]
        new = list(completion.token_ids)
        left = r.max_new_tokens - len(self.out)
        was_forced, kept = self._forced(new, sentinel)
        if was_forced and r.rule.keep_last:
            new[-1] = kept  # the crossing token, recorded where the sentinel ended the request
            self.result = Generation(self.out + new, "eos" if kept in r.eos else "switch")
        elif was_forced:
            self.result = Generation(self.out + new[:-1], "switch", dropped=True)
        elif new and new[-1] in r.eos:
            self.result = Generation(self.out + new, "eos")
        elif completion.finish_reason == "stop" and isinstance(completion.stop_reason, str):
            self.result = Generation(self.out + new, "stop")
        elif completion.finish_reason == "stop" and len(new) < left:
            # The model's own sentinel (only rules that can end use it): go on in a new request.
            # Stop strings are matched within a request; no caller combines them with such a rule.
            self.out += new
            self._next()
        else:
            self.result = Generation(self.out + new, "length")

    def _forced(self, new: list[int], sentinel: int) -> tuple[bool, int]:
        """Whether the run's last token is a sentinel the rule forced, and the token kept in its place."""
        if not (self.request.rule.ends and new and new[-1] == sentinel):
            return False, -1
        if not self.request.rule.keep_last and sentinel >= self.request.seq.runner.vocab_size:
            return True, -1  # a padding id, masked for the model: only a crossing puts it there
        return self.request.seq.runner.vllm_switch.forced(self.serial, len(self.tokens) + len(new) - 1)


class VLLMModelRunner(ModelRunner):
    # Before a model loads: exact distributions only with `logprobs: full` (auto gives the top 20 of a
    # large vocabulary), so a judge on the run's engine goes to an engine that always has them.
    capabilities = Capabilities(hidden_states=True, batched_forward=True, exact_distributions=False)
    backend = ("vllm", "pip install -e '.[vllm]' (docs/vllm.md)")
    conformance = (ConformanceEntry("vllm", needs=("vllm",), atol=2e-3, options={
        "dtype": "float32", "enforce_eager": True, "block_size": 32, "num_threads": 1, "logprobs": "full",
        "kv_cache_memory_bytes": 50331648}),)

    @classmethod
    def decode_path_key(cls, options: Mapping[str, Any], device: str) -> str | None:
        """CUDA graphs on a GPU (`enforce_eager` is keyed as an option): the key GPU runs always had."""
        return "graphs" if str(device).startswith("cuda") else None

    def __init__(
        self,
        path: str,
        name: str | None = None,
        dtype: str = "float32",
        device: str | None = None,
        tokenizer: Any = None,
        trust_remote_code: bool = False,
        num_threads: int | None = None,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.4,
        kv_cache_memory_bytes: int | None = None,
        enable_prefix_caching: bool = True,
        enforce_eager: bool = False,
        block_size: int | None = None,
        logprobs: int | str = "auto",
        max_lookahead: int = 1,
        seed: int = 0,
        multiprocessing: bool = False,
        engine_args: dict[str, Any] | None = None,
        hidden_gpu_memory_utilization: float = 0.05,
        hidden_kv_cache_memory_bytes: int | None = None,
        kv_tokens: int | None = None,
    ):
        """The options are conf/engine/vllm.yaml's (each explained there); `device` is vLLM's platform."""
        super().__init__()
        _check_options(dtype, max_lookahead, hidden_gpu_memory_utilization)
        self.path = path  # as configured (a packaged:<name> stays one)
        path = resolve_model_path(path)  # what vLLM loads: a directory or a hub id
        if num_threads:
            torch.set_num_threads(int(num_threads))
        if not multiprocessing:  # the engine core runs in this process: no IPC per request
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.name = model_name(path, name)
        with model_load_errors(path):
            config = load_config(path, trust_remote_code=trust_remote_code)
            self.tokenizer = load_tokenizer(path, tokenizer, trust_remote_code=trust_remote_code)
        self.model_vocab_size = config.vocab_size
        self.vocab_size = shared_vocab_size(self.tokenizer, config.vocab_size)
        self.hidden_size = config.hidden_size
        self.num_parameters = count_parameters(config)
        if kv_tokens is not None:
            kv_cache_memory_bytes = _kv_pool_bytes(self.name, config, self.num_parameters, dtype, kv_tokens)
        self.eos_token_ids = eos_token_ids(self.tokenizer, generation_eos(path))
        self.top_logprobs = _logprob_count(logprobs, self.model_vocab_size)
        self.max_lookahead = max_lookahead
        self.served_from_lookahead = self.lookahead_tokens = self.requests = self.hidden_requests = 0
        self.generate_calls = self.prefix_cache_retries = 0
        # SwitchProcessor and the kept device rows report through this process's memory: with the
        # engine core in another process, rule runs are a token loop and rows come as logprobs.
        self.switch_in_engine = not multiprocessing
        self.capabilities = Capabilities(hidden_states=True, batched_forward=True,
                                         exact_distributions=self.switch_in_engine or self.top_logprobs == -1)
        self.sentinel = _sentinel(self.vocab_size, self.model_vocab_size, self.eos_token_ids)

        args = dict(
            model=path, tokenizer=path, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_memory_bytes, enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager, block_size=block_size, seed=seed, trust_remote_code=trust_remote_code,
            disable_log_stats=True,
            # xxhash for the prefix cache's block hashes: each request on a long context hashes
            # every full block of it again, and sha256 over pickle costs ~2.7 ms at 16k tokens.
            **{"prefix_caching_hash_algo": "xxhash", **(engine_args or {})},
        )
        # The hidden-state engine shares every argument but its memory share (see open_hidden_engine).
        self._hidden_args = {**args, "gpu_memory_utilization": hidden_gpu_memory_utilization,
                             "kv_cache_memory_bytes": hidden_kv_cache_memory_bytes or kv_cache_memory_bytes}
        self.hidden_llm: Any = None
        self._start_engine(args, dtype)

    @staticmethod
    def check_memory(pair_cfg: dict[str, Any], engine_cfg: dict[str, Any], batch_size: int,
                     longest_prompt: Callable[[Any], int], max_new_tokens: int) -> None:
        """Both pools hold `batch_size` of the run's longest samples (`vllm_memory.check_run`), from config.json."""
        specs = run_model_specs(pair_cfg, engine_cfg)
        models, contexts = [], []
        for role, spec in specs.items():
            path, remote = resolve_model_path(spec["path"]), spec.get("trust_remote_code", False)
            with model_load_errors(path):
                config = load_config(path, trust_remote_code=remote)
                if role == "llm":  # the run's prompts are counted in the LLM's tokens
                    tokenizer = load_tokenizer(path, spec.get("tokenizer"), trust_remote_code=remote)
            models.append(vllm_memory.model_memory(model_name(path, spec.get("name")), config,
                                                   count_parameters(config), spec["dtype"]))
            contexts.append(spec.get("max_model_len") or getattr(config, "max_position_embeddings", None) or 1 << 62)
        max_len = min(longest_prompt(tokenizer) + max_new_tokens, *contexts)
        kv_tokens = {spec.get("kv_tokens") for spec in specs.values()}
        free = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
        for tokens in kv_tokens:
            vllm_memory.check_run(models, batch_size, max_len, tokens if isinstance(tokens, int) else None, free)

    def _start_engine(self, args: dict[str, Any], dtype: str) -> None:
        """vLLM's engine with the switch processor of the model runner it will use (V2 where Triton runs)."""
        from vllm import LLM

        from rstitch.engines import vllm_rows, vllm_switch

        self.vllm_switch = vllm_switch  # the processors' module (it imports vLLM: only once a model loads)
        self.uses_v2_runner = _v2_runner_expected()
        processors = [switch_processor(self.uses_v2_runner)] if self.switch_in_engine else None
        self.llm = LLM(**{k: v for k, v in {**args, "max_logprobs": self.top_logprobs,
                                            "logits_processors": processors}.items() if v is not None})
        vllm_config = self.llm.llm_engine.vllm_config
        if self.switch_in_engine and vllm_config.use_v2_model_runner != self.uses_v2_runner:
            raise ConfigError(f"engine 'vllm': '{self.name}' runs vLLM's {'V2' if vllm_config.use_v2_model_runner else 'V1'} "
                              "model runner, not the one expected: set VLLM_USE_V2_MODEL_RUNNER explicitly")
        self.max_model_len = vllm_config.model_config.max_model_len
        self.engine_steps = 0
        count_engine_steps(self.llm, self._count_step)
        self.block_hasher = ReusingBlockHasher.install(self.llm)
        if self.switch_in_engine:  # verification rows on the device
            self.llm.collective_rpc(vllm_rows.keep_prompt_rows)
        self.identity = vllm_identity(self.name, vllm_config, dtype)

    def new_sequence(self, prompt_ids: Seq[int], want_hidden: bool = False) -> VLLMSequence:
        return VLLMSequence(self, prompt_ids, want_hidden)

    def _count_step(self) -> None:
        self.engine_steps += 1

    def open_hidden_engine(self) -> None:
        """Load the hidden-state engine once: the same weights as a pooling model (`token_embed`: the
        final normed hidden state of every computed position; no activation, which would L2-normalize)."""
        if self.hidden_llm is not None:
            return
        from vllm import LLM
        from vllm.config import PoolerConfig

        pooler = PoolerConfig(task="token_embed", tok_pooling_type="ALL", use_activation=False)
        args = {k: v for k, v in self._hidden_args.items() if v is not None}
        try:
            self.hidden_llm = LLM(runner="pooling", convert="embed", pooler_config=pooler, **args)
        except ValueError as err:  # e.g. an architecture vLLM cannot pool, or no memory left for it
            raise ConfigError(f"engine 'vllm': cannot open the hidden-state engine of '{self.name}': "
                              f"{str(err).splitlines()[0]}") from None

    def hidden_states(self, token_ids: list[int], n_rows: int) -> torch.Tensor:
        """The last hidden states [n_rows, H] (float32) of the last `n_rows` positions of `token_ids`."""
        # Only computed positions get a state: the prefix cache is read as in `_Scoring`.
        data = self._pool(token_ids, read_cache=cached_tokens(self.hidden_llm, token_ids) <= len(token_ids) - n_rows)
        if data.shape[0] < n_rows:
            self.prefix_cache_retries += 1
            data = self._pool(token_ids, read_cache=False)
        return data[-n_rows:].float()

    def _pool(self, token_ids: list[int], read_cache: bool) -> torch.Tensor:
        from vllm import PoolingParams
        from vllm.inputs import TokensPrompt

        self.hidden_requests += 1
        params = PoolingParams(use_activation=False, skip_reading_prefix_cache=not read_cache)
        [out] = self.hidden_llm.encode([TokensPrompt(prompt_token_ids=token_ids)], params, use_tqdm=False,
                                       pooling_task="token_embed")
        return out.outputs.data

    def forward_batch(self, requests: list[Any]) -> list[Any]:
        """Forwards (`ForwardRequest`) and runs (`RunRequest`) of many sequences: one `generate` call per round."""
        works = [_Run(r) if isinstance(r, RunRequest) else _Scoring(r.seq, list(r.new_ids), r.keep) for r in requests]
        while pending := [w for w in works if w.result is None]:
            for work, out in zip(pending, self.run_many([w.tokens for w in pending], [w.params for w in pending])):
                work.take(out)
        return [w.result for w in works]

    def run_many(self, prompts: list[list[int]], params: list[Any]) -> list[Any]:
        """One `generate` call: one request per prompt, outputs in the prompts' order."""
        from vllm.inputs import TokensPrompt

        self.requests += len(prompts)
        self.generate_calls += 1
        return self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)

    def room(self, n_tokens: int, wanted: int) -> int:
        """How many tokens a request may generate after `n_tokens` (at least one)."""
        left = self.max_model_len - n_tokens
        if left < 1:
            raise ConfigError(
                f"a sequence of {n_tokens} tokens leaves no room in engine.max_model_len={self.max_model_len} of '{self.name}'"
            )
        return min(wanted, left)

    def scoring_params(self, lookahead: int, keep: int, read_cache: bool, serial: int | None = None,
                       n_tokens: int = 0) -> Any:
        """A greedy scoring request of `lookahead` tokens whose rows (the last `keep` - 1 prompt positions'
        and the decoded tokens') are kept on the device under `serial`; else vLLM's logprobs."""
        from vllm import SamplingParams

        prompt_rows = keep > 1
        on_device = self.switch_in_engine and serial is not None
        capture = {"serial": serial, "vocab": self.vocab_size}
        if prompt_rows:
            capture["prompt_from"] = n_tokens - keep + 1
        return SamplingParams(
            temperature=0.0, max_tokens=lookahead, logprobs=None if on_device else self.top_logprobs, detokenize=False,
            flat_logprobs=True, prompt_logprobs=self.top_logprobs if prompt_rows and not on_device else None,
            # Positions the prefix cache covers get no prompt rows: `_Scoring` checks.
            skip_reading_prefix_cache=not read_cache if prompt_rows else None,
            extra_args={self.vllm_switch.CAPTURE_KEY: capture} if on_device else None,
        )

    def scoring_rows(self, out: Any, serial: int, n_tokens: int, keep: int, n_generated: int) -> list[torch.Tensor]:
        """The rows `scoring_params` asked for (the row at position p predicts token p)."""
        if not self.switch_in_engine:
            prompt = [self.dense_row(out.prompt_logprobs, p) for p in range(n_tokens - keep + 1, n_tokens)]
            return prompt + [self.dense_row(out.outputs[0].logprobs, i) for i in range(n_generated)]
        kept = self.vllm_switch.captured(serial)
        wanted = range(n_tokens - keep + 1, n_tokens + n_generated)
        missing = [p for p in wanted if p not in kept]
        if missing:
            raise RuntimeError(f"engine 'vllm': no logits kept for positions {missing} of request {serial}")
        return [kept[p] for p in wanted]

    def run_params(self, max_tokens: int, sampler: Sampler, stop: Seq[str], eos: set[int], rule: SwitchRule,
                   serial: int) -> Any:
        """A run's request: stop strings, EOS ids and the sentinel as stops; the rule for `SwitchProcessor`
        (which also masks ids beyond the shared vocabulary, as the HF engine cuts its logits)."""
        from vllm import SamplingParams

        stop = [s for s in stop if s]
        sampling: dict[str, Any] = {"temperature": 0.0}
        if not sampler.greedy:
            seed = int(torch.randint(0, 2**31 - 1, (), generator=sampler.generator))
            sampling = {"temperature": float(sampler.temperature), "top_p": float(sampler.top_p), "seed": seed}
        stop_ids = eos | ({self.sentinel} if rule.ends else set())
        extra = None  # the processor takes part only where it has work: a rule, or ids to mask
        if self.switch_in_engine and (rule.ends or self.vocab_size < self.model_vocab_size):
            extra = {self.vllm_switch.KEY: {
                "serial": serial, "vocab": self.vocab_size, "sentinel": self.sentinel,
                "tau": float(rule.tau) if rule.ends else None, "stop_above": rule.stop_above, "keep_last": rule.keep_last,
            }}
        return SamplingParams(
            max_tokens=max_tokens, stop=stop or None, stop_token_ids=sorted(stop_ids), ignore_eos=True,
            include_stop_str_in_output=True, skip_special_tokens=False, detokenize=bool(stop), extra_args=extra,
            **sampling,
        )

    def dense_row(self, flat: Any, position: int) -> torch.Tensor:
        """Position `position` of vLLM's flat logprobs as a log-probability row over the vocabulary."""
        start, end = flat.start_indices[position], flat.end_indices[position]
        ids = torch.tensor(flat.token_ids[start:end], dtype=torch.long)
        values = torch.tensor(flat.logprobs[start:end], dtype=torch.float32)
        return complete_topk(ids, values, self.model_vocab_size)[: self.vocab_size]


def _check_options(dtype: str, max_lookahead: Any, hidden_fraction: Any) -> None:
    torch_dtype(dtype)
    if isinstance(max_lookahead, bool) or not isinstance(max_lookahead, int) or max_lookahead < 1:
        raise ConfigError(f"engine.max_lookahead must be an integer >= 1, got {max_lookahead!r}")
    # Checked now: the hidden-state engine is loaded only at the first sequence that wants it.
    if not (isinstance(hidden_fraction, (int, float)) and not isinstance(hidden_fraction, bool) and 0 < hidden_fraction <= 1):
        raise ConfigError(f"engine.hidden_gpu_memory_utilization must be in (0, 1], got {hidden_fraction!r}")


def cached_tokens(llm: Any, token_ids: list[int]) -> int:
    """How many leading tokens of `token_ids` `llm`'s prefix cache holds now (engine core elsewhere: all it could)."""
    block = llm.llm_engine.vllm_config.cache_config.block_size
    limit = (len(token_ids) - 1) // block * block
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    if limit == 0 or core is None:
        return limit
    from vllm import SamplingParams
    from vllm.v1.request import Request

    probe = Request("rstitch-prefix-probe", token_ids, SamplingParams(max_tokens=1), None,
                    block_hasher=core.request_block_hasher)
    return core.scheduler.kv_cache_manager.get_computed_blocks(probe)[1]


class ReusingBlockHasher:
    """The engine core's prefix-cache block hasher, reusing the hashes of the full blocks a recent
    prompt shares with a new one (vLLM hashes every full block of each request's whole context:
    kv_cache_utils.get_request_block_hasher). docs/vllm.md, "A forward is a request"."""

    def __init__(self, compute: Callable[[Any], list[Any]], block_size: int, recent: int = 64):
        self.compute, self.block_size, self.recent = compute, block_size, recent
        self.history: dict[int, tuple[list[int], list[Any]]] = {}  # insertion-ordered: oldest first
        self.hashed_blocks = self.reused_blocks = self._serial = 0

    @classmethod
    def install(cls, llm: Any) -> ReusingBlockHasher | None:
        """Wraps `llm`'s hasher (engine core in this process, prefix caching on), else None."""
        core: Any = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
        if getattr(core, "request_block_hasher", None) is None:
            return None
        hasher = cls(core.request_block_hasher, core.scheduler.hash_block_size)
        core.request_block_hasher = hasher
        return hasher

    def __call__(self, request: Any) -> list[Any]:
        plain = not request.block_hashes and not (request.mm_features or request.lora_request or request.cache_salt)
        seed = self._shared(request.prompt_token_ids) if plain else []
        if seed:  # the original continues from the blocks it finds on the request
            empty, request.block_hashes = request.block_hashes, seed
            try:
                new = self.compute(request)
            finally:  # the list the caller extends with what this returns
                request.block_hashes = empty
            hashes = seed + new
        else:
            hashes = new = self.compute(request)
        self.hashed_blocks += len(new)
        self.reused_blocks += len(seed)
        if plain and hashes:
            self._serial += 1
            self.history[self._serial] = (list(request.prompt_token_ids), hashes)
            if len(self.history) > self.recent:
                del self.history[next(iter(self.history))]
        return hashes

    def _shared(self, tokens: list[int]) -> list[Any]:
        """The longest run of full-block hashes a recent prompt shares with `tokens` (newest first)."""
        best: list[Any] = []
        size = self.block_size
        for previous, hashes in reversed(self.history.values()):
            # The first block count that disagrees, by bisection (slices compare in C), less one.
            agree = bisect.bisect_left(range(min(len(hashes), len(tokens) // size) + 1), True, lo=len(best) + 1,
                                       key=lambda m: previous[: m * size] != tokens[: m * size]) - 1
            if agree > len(best):
                best = hashes[:agree]
        return best


def count_engine_steps(llm: Any, on_step: Callable[[], None]) -> None:
    """Call `on_step` at each forward of `llm`'s model executor (engine core in this process only)."""
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    executor = getattr(core, "model_executor", None)
    if executor is None:
        return
    execute = executor.execute_model

    def counted(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(scheduler_output, "total_num_scheduled_tokens", 1):
            on_step()
        return execute(scheduler_output, *args, **kwargs)

    executor.execute_model = counted


def _kv_pool_bytes(name: str, config: Any, num_parameters: int, dtype: str, kv_tokens: Any) -> int:
    """`kv_tokens` of the model's KV in bytes; on a GPU, one line unless it fits the free memory."""
    if isinstance(kv_tokens, bool) or not isinstance(kv_tokens, int) or kv_tokens < 1:
        raise ConfigError(f"engine.kv_tokens must be an integer >= 1 or null, got {kv_tokens!r}")
    need = vllm_memory.model_memory(name, config, num_parameters, dtype)
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        vllm_memory.plan(free, [need], 1, kv_tokens, utilization=1.0)
    return kv_tokens * need.kv_bytes_per_token


def _v2_runner_expected() -> bool:
    """Whether vLLM will run its V2 model runner: the environment's choice, else wherever Triton runs."""
    from vllm import envs
    from vllm.triton_utils import HAS_TRITON

    chosen = envs.VLLM_USE_V2_MODEL_RUNNER
    return bool(HAS_TRITON) if chosen is None else bool(chosen)


def switch_processor(v2: bool) -> type:
    from rstitch.engines.vllm_switch import SwitchProcessor, SwitchProcessorV2

    return SwitchProcessorV2 if v2 else SwitchProcessor


def vllm_identity(name: str, vllm_config: Any, dtype: str) -> EngineIdentity:
    """The device vLLM's platform runs on and the dtype asked for, under the engine's own name."""
    device = getattr(getattr(vllm_config, "device_config", None), "device_type", None)
    if device is None:  # vLLM itself only where the config does not say (the tests check identities without it)
        from vllm.platforms import current_platform

        device = current_platform.device_type
    return EngineIdentity("vllm", name, str(device), dtype)


def _logprob_count(logprobs: int | str, vocab_size: int) -> int:
    """vLLM's `logprobs` value: -1 for the whole vocabulary, else the top k."""
    if logprobs == "auto":
        return -1 if vocab_size <= FULL_VOCAB_LIMIT else AUTO_TOPK
    if logprobs == "full":
        return -1
    if isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 1:
        raise ConfigError(f"engine.logprobs must be auto, full or an integer >= 1, got {logprobs!r}")
    return -1 if logprobs >= vocab_size else logprobs


def _sentinel(vocab_size: int, model_vocab_size: int, eos: list[int]) -> int:
    """The token `SwitchProcessor` forces to end a run: a (masked) padding id, else the last non-EOS id."""
    if model_vocab_size > vocab_size:
        return model_vocab_size - 1
    return max(i for i in range(vocab_size - len(eos) - 1, vocab_size) if i not in eos)


RUNNER = VLLMModelRunner  # the class engines.ENGINES registers for conf/engine/vllm.yaml
