"""Decoding methods, one module each, written only against the engine interface. Each registers
itself in `METHODS`, which imports them at its first read (methods/base.py METHOD_MODULES)."""
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
