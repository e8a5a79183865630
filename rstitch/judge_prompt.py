"""SpecReason's judge prompt (methods/specreason.py), kept below every layer: the method, the LLM-judge
PRM and the testbed tokenizer (trained on these strings: scripts/train_testbed.py) all read it."""
from __future__ import annotations

from typing import Any

JUDGE_INSTRUCTION = (
    "Evaluate the last reasoning step solely based on factual correctness and logical validity. "
    "Ignore style, phrasing, or overall usefulness—only judge whether the step is objectively "
    "correct and logically follows from prior steps. Assign a score from 0 to 9."
)
JUDGE_PREFIX = "I think the quality score is: "


def judge_prompt(tokenizer: Any, problem: str, steps: list[str], separator: str) -> str:
    """[user: problem, assistant: the steps, user: JUDGE_INSTRUCTION], then JUDGE_PREFIX; the judge answers a digit."""
    messages = [
        {"role": "user", "content": problem},
        {"role": "assistant", "content": separator.join(steps)},
        {"role": "user", "content": JUDGE_INSTRUCTION},
    ]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) + JUDGE_PREFIX
