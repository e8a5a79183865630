"""Settings presets of Arbitrage router training (`scripts/train_arbitrage_router.py --settings`):
`paper` is Table C.1's recipe; `testbed` (the default) ours, as docs/fidelity.md "Arbitrage" explains.
"""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from rstitch.errors import ConfigError

# init: "slm" (the pair's draft model) or "prm" (the PRM's checkpoint: --prm-path; the testbed PRM is
# the testbed LLM read through its predictions, so its checkpoint is --llm).
ROUTER_TRAINING_SETTINGS: dict[str, dict[str, Any]] = {
    "testbed": {"init": "slm", "batch_size": 16, "lr": 5e-4, "epochs": 4},
    "paper": {"init": "prm", "batch_size": 1024, "lr": 1e-5, "epochs": 3},
}


def apply_router_training_settings(args: argparse.Namespace, defaults: Mapping[str, Any]) -> argparse.Namespace:
    """Set `args.init`, `batch_size`, `lr` and `epochs` from the preset `args.settings`, except where a
    flag was given (its value differs from its parser default in `defaults`)."""
    if args.settings not in ROUTER_TRAINING_SETTINGS:
        raise ConfigError(f"--settings must be one of {', '.join(ROUTER_TRAINING_SETTINGS)}, got {args.settings!r}")
    preset = ROUTER_TRAINING_SETTINGS[args.settings]
    for key in ("batch_size", "lr", "epochs"):
        if getattr(args, key) == defaults.get(key):
            setattr(args, key, preset[key])
    if args.init == defaults.get("init") and preset["init"] == "prm":
        args.init = args.prm_path or (args.llm if args.prm == "testbed" else None)
        if args.init is None:
            raise ConfigError(f"--settings {args.settings} starts the router from the PRM's checkpoint: "
                              "give --prm-path (or --init)")
    return args
