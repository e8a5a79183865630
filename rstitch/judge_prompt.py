"""SpecReason's judge prompt (methods/specreason.py): the question asked of the judge, the start
of its answer, and their one renderer."""
from __future__ import annotations

from typing import Any

# The judge's question (SpecReason's) and the start of its answer; the testbed's LLM is trained on
# exactly this prompt (scripts/train_testbed.py), so it is rendered here only, by `judge_prompt`.
# Kept below every layer: the method, the LLM-judge PRM and the testbed tokenizer (which is trained
# on these strings, so each is a few tokens) all read it.
JUDGE_INSTRUCTION = (
    "Evaluate the last reasoning step solely based on factual correctness and logical validity. "
    "Ignore style, phrasing, or overall usefulness—only judge whether the step is objectively "
    "correct and logically follows from prior steps. Assign a score from 0 to 9."
)
JUDGE_PREFIX = "I think the quality score is: "


def judge_prompt(tokenizer: Any, problem: str, steps: list[str], separator: str) -> str:
    """The conversation [user: problem, assistant: `steps` joined by `separator`, user:
    JUDGE_INSTRUCTION] with the generation prompt, then JUDGE_PREFIX; the judge answers one digit."""
    messages = [
        {"role": "user", "content": problem},
        {"role": "assistant", "content": separator.join(steps)},
        {"role": "user", "content": JUDGE_INSTRUCTION},
    ]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) + JUDGE_PREFIX
