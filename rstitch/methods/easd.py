"""EASD: entropy-aware speculative decoding (EASD §3, eqs. 1-10; Algorithm 1 in appendix B).

SpecDec (eq. 1) plus a penalty: at a draft position where the draft's and the target's Shannon
entropies (eqs. 2-3: nats, of the raw model distributions) both exceed tau_H (eq. 4) and their
top-n token sets overlap by at least tau_O (eq. 5: |T_d ∩ T_t| / n >= tau_O), the draft token is
rejected and the target draws the position from its own distribution with that token's
probability set to zero and the rest renormalized (eqs. 6-7). Eq. 5's condition (§3.4) is strict
(> tau_O), but §3.6 fixes tau_O = 0.8 as "at least four out of the top-5 tokens coincide": we
follow the stated meaning (with n = 5 the strict sign would need all five). Both models being
unsure yet agreeing on the candidates is where a plausible-but-wrong draft token slips through
the ratio test.

tau_H is calibrated per pair (§3.6, eqs. 8-10: the mean of the top 5% target entropies; §4.1: on
LIMO; scripts/calibrate_easd.py) and stored in the user's calibration file (`method.calibration`,
by default $RSTITCH_CACHE/easd_calibration.json); `tau_h: auto` reads the pair's entry there, else
in easd_calibration.json next to this module (shipped with the package: the testbed pair's).
Appendices D and E give tau_H = 2 ("Entropy = 2") for the main experiments instead: `tau_h: 2.0`.
The ablations of the paper's Table 2 drop the overlap condition (`use_overlap: false`), the
draft-entropy condition (`use_draft_entropy: false`), or both.
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
from rstitch.methods.base import DecodeContext, DecodeResult, Method, register_method, require_int, require_number
from rstitch.methods.spec_stats import summarize_spec
from rstitch.methods.specdec import SpeculativeDecoder

PACKAGED_CALIBRATION = Path(__file__).with_name("easd_calibration.json")  # read-only: the testbed pair's entry
OVERLAP_TOLERANCE = 1e-9  # k / n against a decimal tau_O: 4 / 5 must count as 0.8


def top_overlap(a: TokenDistribution, b: TokenDistribution, n: int) -> float:
    """|top-n(a) ∩ top-n(b)| / n."""
    n = min(n, a.logits.shape[-1])
    return len(set(a.topk(n)[0]) & set(b.topk(n)[0])) / n


@dataclass(frozen=True)
class EntropyPenalty:
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
        # ">=": the paper's "at least 4 of the top 5" at tau_O = 0.8 (its equation's strict sign needs 5 of 5).
        return not self.use_overlap or top_overlap(draft, target, self.top_n) >= self.tau_o - OVERLAP_TOLERANCE

    def replacement_probs(self, sampler: Sampler, target: TokenDistribution, token: int) -> torch.Tensor:
        """Eq. 7: the target's distribution without `token`, renormalized. Masking the logit
        before the Sampler's processing keeps this defined under greedy and top-p, where the
        processed distribution may have all its mass on `token`."""
        masked = target.logits.clone()
        masked[token] = float("-inf")
        return sampler.probs_from_logits(masked)


# --- calibration storage ------------------------------------------------------------------
def user_calibration_file() -> Path:
    """Where scripts/calibrate_easd.py writes by default, as conf/method/easd.yaml's `calibration`
    names it: $RSTITCH_CACHE (default ~/.cache/rstitch)/easd_calibration.json."""
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
    """The stored tau_H of the first entry, in `files` order, whose models are this pair's
    (matched by model name)."""
    for path in files:
        for entry in read_calibration(path).values():
            if entry.get("slm") == pair.slm.name and entry.get("llm") == pair.llm.name:
                return float(entry["tau_h"])
    raise ConfigError(
        f"method.tau_h of 'easd' is 'auto' but no calibration for SLM '{pair.slm.name}' and LLM '{pair.llm.name}' "
        f"is in {' or '.join(map(str, files))}; run scripts/calibrate_easd.py (it writes {files[0]}) or set method.tau_h=<nats>"
    )


def _require_tau_h(value: Any) -> float | str:
    if value == "auto":
        return value
    if isinstance(value, str):
        raise ConfigError(f"method.tau_h of 'easd' must be a number of nats or 'auto', got {value!r}")
    return require_number("easd", "tau_h", value)


def _require_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"method.{key} of 'easd' must be true or false, got {value!r}")
    return value


@register_method("easd")
class EASD(Method):
    family = "speculative"

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
        self.k = require_int("easd", "k", k)
        self.tau_h = _require_tau_h(tau_h)
        self.top_n = require_int("easd", "top_n", top_n)
        self.tau_o = require_number("easd", "tau_o", tau_o, 0.0, 1.0)
        self.use_overlap = _require_bool("use_overlap", use_overlap)
        self.use_draft_entropy = _require_bool("use_draft_entropy", use_draft_entropy)
        if calibration is not None and not isinstance(calibration, str):
            raise ConfigError(f"method.calibration of 'easd' must be a file path or null, got {calibration!r}")
        # tau_h: auto looks in the user's calibration file first, then in the one shipped with the package.
        user = [Path(calibration).expanduser()] if calibration else []
        self.calibration_files = [*user, PACKAGED_CALIBRATION]
        self._penalties: dict[tuple[str, str], EntropyPenalty] = {}  # per pair, read once

    def penalty_for(self, pair: ModelPair) -> EntropyPenalty:
        key = (pair.slm.name, pair.llm.name)
        if key not in self._penalties:
            # _require_tau_h lets one string through: "auto".
            tau_h = calibrated_tau_h(pair, self.calibration_files) if isinstance(self.tau_h, str) else self.tau_h
            self._penalties[key] = EntropyPenalty(tau_h, self.top_n, self.tau_o, self.use_overlap, self.use_draft_entropy)
        return self._penalties[key]

    def decode(self, prompt_ids: list[int], ctx: DecodeContext) -> DecodeResult:
        penalty = self.penalty_for(ctx.pair)
        result = SpeculativeDecoder(self.k, penalty).decode(prompt_ids, ctx)
        result.stats["easd_tau_h"] = penalty.tau_h  # the value used, also when read from calibration
        return result

    def summarize(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        return summarize_spec(samples)
