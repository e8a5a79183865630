"""EASD: entropy-aware speculative decoding (EASD §3, eqs. 1-10; Algorithm 1 in appendix B): SpecDec
plus a penalty where both models are unsure yet agree on the candidates, where a plausible-but-wrong
draft token slips through the ratio test. The rule, tau_H's calibration and the ablations:
docs/speculative.md.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rstitch.engines import ModelPair, Sampler, TokenDistribution
from rstitch.engines.packaged import cache_root
from rstitch.errors import ConfigError
from rstitch.methods.base import DecodeContext, DecodeResult, register_method, require_bool, require_int, require_number
from rstitch.methods.specdec import SpecDec

PACKAGED_CALIBRATION = Path(__file__).with_name("easd_calibration.json")  # read-only: the testbed pair's entry
OVERLAP_TOLERANCE = 1e-9  # k / n against a decimal tau_O: 4 / 5 must count as 0.8


def top_overlap(a: TokenDistribution, b: TokenDistribution, n: int) -> float:
    """|top-n(a) ∩ top-n(b)| / n."""
    n = min(n, a.logits.shape[-1])
    return len(set(a.topk(n)[0]) & set(b.topk(n)[0])) / n


@dataclass(frozen=True)
class EntropyPenalty:
    """Eqs. 4-5's conditions (§3.4) and eq. 7's resampling: see `DraftPenalty`."""
    tau_h: float
    top_n: int = 5
    tau_o: float = 0.8
    use_overlap: bool = True
    use_draft_entropy: bool = True

    def applies(self, draft: TokenDistribution, target: TokenDistribution) -> bool:
        if target.entropy <= self.tau_h:
            return False
        if self.use_draft_entropy and draft.entropy <= self.tau_h:
            return False
        # ">=": §3.6's "at least four out of the top-5 tokens coincide" at tau_O = 0.8 (eq. 5's strict sign needs 5 of 5).
        return not self.use_overlap or top_overlap(draft, target, self.top_n) >= self.tau_o - OVERLAP_TOLERANCE

    def replacement_probs(self, sampler: Sampler, target: TokenDistribution, token: int) -> torch.Tensor:
        """Eq. 7: the target's distribution without `token`, renormalized. Masking the logit
        before the Sampler's processing keeps this defined under greedy and top-p, where the
        processed distribution may have all its mass on `token`."""
        masked = target.logits.clone()
        masked[token] = float("-inf")
        return sampler.probs_from_logits(masked)


def user_calibration_file() -> Path:
    """Where scripts/calibrate_easd.py writes by default (conf/method/easd.yaml's `calibration`)."""
    return cache_root() / "easd_calibration.json"


def read_calibration(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"EASD calibration file {path} is not JSON ({err.msg}, line {err.lineno})") from None


def store_calibration(pair_name: str, entry: dict[str, Any], path: Path) -> Path:
    """Write (or replace) the entry of `pair_name`; `entry` names its models under 'slm'/'llm'."""
    table = read_calibration(path)
    table[pair_name] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    return path


def calibrated_tau_h(pair: ModelPair, files: Sequence[Path] = (PACKAGED_CALIBRATION,)) -> float:
    """The stored tau_H of the first entry, in `files` order, whose model names are this pair's."""
    for path in files:
        for entry in read_calibration(path).values():
            if entry.get("slm") == pair.slm.name and entry.get("llm") == pair.llm.name:
                return float(entry["tau_h"])
    raise ConfigError(
        f"method.tau_h of 'easd' is 'auto' but no calibration for SLM '{pair.slm.name}' and LLM '{pair.llm.name}' "
        f"is in {' or '.join(map(str, files))}; run scripts/calibrate_easd.py (it writes {files[0]}) or set method.tau_h=<nats>"
    )


@register_method("easd")
class EASD(SpecDec):
    def __init__(
        self,
        k: int = 5,
        tau_h: float | str = "auto",
        top_n: int = 5,
        tau_o: float = 0.8,
        use_overlap: bool = True,
        use_draft_entropy: bool = True,
        calibration: str | None = None,
    ):
        super().__init__(k)
        if isinstance(tau_h, str) and tau_h != "auto":
            raise ConfigError(f"method.tau_h of 'easd' must be a number of nats or 'auto', got {tau_h!r}")
        self.tau_h = tau_h if tau_h == "auto" else require_number("easd", "tau_h", tau_h)
        self.top_n = require_int("easd", "top_n", top_n)
        self.tau_o = require_number("easd", "tau_o", tau_o, 0.0, 1.0)
        self.use_overlap = require_bool("easd", "use_overlap", use_overlap)
        self.use_draft_entropy = require_bool("easd", "use_draft_entropy", use_draft_entropy)
        if calibration is not None and not isinstance(calibration, str):
            raise ConfigError(f"method.calibration of 'easd' must be a file path or null, got {calibration!r}")
        # tau_h: auto looks in the user's calibration file first, then in the one shipped with the package.
        user = [Path(calibration).expanduser()] if calibration else []
        self.calibration_files = [*user, PACKAGED_CALIBRATION]
        self._penalties: dict[tuple[str, str], EntropyPenalty] = {}  # per pair, read once

    def penalty_for(self, pair: ModelPair) -> EntropyPenalty:
        key = (pair.slm.name, pair.llm.name)
        if key not in self._penalties:
            # The one string __init__ lets through is "auto".
            tau_h = calibrated_tau_h(pair, self.calibration_files) if isinstance(self.tau_h, str) else self.tau_h
            self._penalties[key] = EntropyPenalty(tau_h, self.top_n, self.tau_o, self.use_overlap, self.use_draft_entropy)
        return self._penalties[key]

    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        result = super().decode(prompt_ids, ctx)
        result.stats["easd_tau_h"] = self.penalty_for(ctx.pair).tau_h  # the value used, also when read from calibration
        return result
