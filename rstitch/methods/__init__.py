"""Decoding methods, one module each, written only against the engine interface."""
from rstitch.methods.base import METHODS, DecodeContext, DecodeResult, Method, build_method, register_method
from rstitch.methods import random_routing, rstitch, rstitch_deer, rstitch_plus, single, specdec, easd, rsd, specreason, arbitrage, prm_search  # noqa: F401  (registration)

__all__ = ["METHODS", "DecodeContext", "DecodeResult", "Method", "build_method", "register_method"]
