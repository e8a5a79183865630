"""Offline CPU-scale testbed: a synthetic arithmetic reasoning task and a family of tiny models
(SLM, LLM, PRM) sharing one tokenizer (docs/testbed.md)."""

from pathlib import Path

from .checking import check_steps, extract_boxed, first_wrong_step, is_correct, split_steps
from .corruption import corrupt_steps
from .problems import STEP_SEPARATOR, Difficulty, TestbedProblem, generate_problems, make_problem

ASSETS_DIR = Path(__file__).parent / "assets"
TOKENIZER_DIR = ASSETS_DIR / "tokenizer"
SLM_DIR = ASSETS_DIR / "slm"
LLM_DIR = ASSETS_DIR / "llm"
PRM_DIR = ASSETS_DIR / "prm"

__all__ = [
    "ASSETS_DIR", "TOKENIZER_DIR", "SLM_DIR", "LLM_DIR", "PRM_DIR", "STEP_SEPARATOR", "Difficulty", "TestbedProblem",
    "check_steps", "corrupt_steps", "extract_boxed", "first_wrong_step", "generate_problems", "is_correct",
    "make_problem", "split_steps",
]
