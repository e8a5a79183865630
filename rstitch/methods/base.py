"""What a decoding method is: given a prompt and a model pair, produce output tokens."""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rstitch.engines import ModelPair, Sampler
from rstitch.errors import ConfigError
from rstitch.registry import Registry

SLM, LLM = 0, 1  # token sources

# What kind of hybrid a method is (docs/adding-a-method.md: single tokens, drafted tokens, steps).
FAMILIES = ("token", "speculative", "step")
# Single-model reference runs: `target`, the LLM alone (speedups are against it); `draft`, the SLM alone.
BASELINE_ROLES = ("target", "draft")


@dataclass
class DecodeContext:
    """Everything a method may use for one sample."""

    pair: ModelPair
    sampler: Sampler
    max_new_tokens: int
    problem: str = ""  # the problem text (PRMs, judges and routers read it)
    metadata: dict[str, Any] = field(default_factory=dict)  # the dataset record's metadata

    def runner(self, source: int):
        return self.pair.slm if source == SLM else self.pair.llm

    @property
    def eos_ids(self) -> set[int]:
        return set(self.pair.llm.eos_token_ids) | set(self.pair.slm.eos_token_ids)


@dataclass
class DecodeResult:
    token_ids: list[int]
    sources: list[int]  # SLM or LLM for each output token
    finish_reason: str  # "eos" | "length" | method-specific (e.g. "step_cap")
    discarded_tokens: int = 0  # tokens computed and thrown away (rejected drafts, R-Stitch rollbacks)
    switches: int = 0  # hand-overs between the models
    stats: dict[str, Any] = field(default_factory=dict)  # method-specific counters

    def tokens_by(self, source: int) -> int:
        return sum(1 for s in self.sources if s == source)


class Method(ABC):
    """A decoding strategy. Subclasses declare their parameters in __init__ and register a name."""

    name: ClassVar[str]
    family: ClassVar[str]  # one of FAMILIES; every registered method declares it
    baseline: ClassVar[str | None] = None  # one of BASELINE_ROLES for a single-model reference
    reads_hidden_states: ClassVar[bool] = False  # asks sequences for last hidden states (not every engine has them)

    @abstractmethod
    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        """Decode one sample at batch size 1."""

    def summarize(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        """Run-level statistics beyond the common ones, from the samples.jsonl records."""
        return {}


# Per-sample FLOPs of the models outside the pair (PRM, routers), which the runner adds to the pair's
# own; FLOPs = 2 x parameters x processed tokens (RSD section 3.3).
EXTRA_FLOPS = "extra_flops"


def model_flops(num_parameters: int, tokens: int) -> float:
    return 2.0 * num_parameters * tokens


def _check_metadata(name: str, cls: type[Method]) -> None:
    """A programming error, raised at import: results would otherwise be grouped wrongly."""
    if getattr(cls, "family", None) not in FAMILIES:
        raise ValueError(f"method '{name}' must declare family as one of {', '.join(FAMILIES)}")
    if cls.baseline is not None and cls.baseline not in BASELINE_ROLES:
        raise ValueError(f"method '{name}': baseline must be None or one of {', '.join(BASELINE_ROLES)}")
    # Only a baseline reads the registry (loading every method module): a hybrid registers without it,
    # so a module that subclasses another's method (EASD's SpecDec) may be imported first.
    taken = [other for other, c in METHODS.items() if c.baseline == cls.baseline] if cls.baseline is not None else []
    if taken:
        raise ValueError(f"method '{name}': baseline role '{cls.baseline}' is taken by '{taken[0]}'")
    cls.name = name


# Every method module registers its class here at import; the registry imports them at its first read.
METHOD_MODULES = tuple(f"rstitch.methods.{m}" for m in (
    "arbitrage", "easd", "prm_search", "random_routing", "rsd", "rstitch", "rstitch_deer", "rstitch_plus", "single", "specdec",
    "specreason"))
METHODS: Registry[type[Method]] = Registry("method", modules=METHOD_MODULES, validate=_check_metadata)


def register_method(name: str) -> Callable[[type[Method]], type[Method]]:
    return METHODS.decorator(name)


def method_class(name: str) -> type[Method]:
    """The registered class of `name`; an unknown name is a one-line error, not a silent default."""
    return METHODS.get_entry(name)


def baseline_method(role: str = "target") -> str:
    """The name of the method with baseline role `role` (`target`: the one speedups are against)."""
    found = [name for name, cls in METHODS.items() if cls.baseline == role]
    if not found:
        raise ConfigError(f"no registered method has baseline role '{role}'")
    return found[0]


def method_rank(name: str) -> tuple[int, str]:
    """Table order: the baselines in BASELINE_ROLES order, then the other methods by name."""
    role = method_class(name).baseline
    return (BASELINE_ROLES.index(role), "") if role is not None else (len(BASELINE_ROLES), name)


def build_method(name: str, **params: Any) -> Method:
    """The method `name`; a missing or unknown parameter is one error line."""
    return METHODS.build(name, **params)


def require_number(method: str, key: str, value: Any, low: float | None = None, high: float | None = None,
                   infinite_ok: bool = False) -> float:
    """Thresholds come from the command line: reject strings, booleans, NaN (it compares false with
    every threshold, so it would silently pick one model) and, unless ``infinite_ok`` (a threshold
    whose documented extremes are +-inf), infinities, with one clear line."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
            or (math.isinf(value) and not infinite_ok)):
        raise ConfigError(f"method.{key} of '{method}' must be a {'' if infinite_ok else 'finite '}number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        allowed = f"[{low}, {high}]" if low is not None and high is not None else f">= {low}" if low is not None else f"<= {high}"
        raise ConfigError(f"method.{key} of '{method}' must be {'in ' if allowed[0] == '[' else ''}{allowed}, got {value!r}")
    return float(value)


def require_int(method: str, key: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"method.{key} of '{method}' must be an integer >= {low}, got {value!r}")
    return value


def require_bool(method: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"method.{key} of '{method}' must be true or false, got {value!r}")
    return value


def require_choice(method: str, key: str, value: Any, options: Iterable[str]) -> str:
    if value not in options:
        raise ConfigError(f"method.{key} of '{method}' must be one of {', '.join(options)}, got {value!r}")
    return value
