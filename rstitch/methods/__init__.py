"""Decoding methods, one module each, written only against the engine interface."""
from rstitch.methods import arbitrage, easd, prm_search, random_routing, rsd, rstitch, rstitch_deer, rstitch_plus, single, specdec, specreason  # noqa: F401  (registration)
from rstitch.methods.base import (
                                  BASELINE_ROLES,
                                  FAMILIES,
                                  METHODS,
                                  DecodeContext,
                                  DecodeResult,
                                  Method,
                                  baseline_method,
                                  build_method,
                                  method_class,
                                  method_rank,
                                  register_method,
)

__all__ = ["BASELINE_ROLES", "FAMILIES", "METHODS", "DecodeContext", "DecodeResult", "Method", "baseline_method",
           "build_method", "method_class", "method_rank", "register_method"]
