"""Decoding methods, one module each, written only against the engine interface."""
from rstitch.methods.base import (BASELINE_ROLES, FAMILIES, METHODS, DecodeContext, DecodeResult, Method, baseline_method,
                                  build_method, method_class, method_rank, register_method)
from rstitch.methods import random_routing, rstitch, rstitch_deer, rstitch_plus, single, specdec, easd, rsd, specreason, arbitrage, prm_search  # noqa: F401  (registration)

__all__ = ["BASELINE_ROLES", "FAMILIES", "METHODS", "DecodeContext", "DecodeResult", "Method", "baseline_method",
           "build_method", "method_class", "method_rank", "register_method"]
