"""A stand-in PRM for pairs that have none: an instruct model judges each step (`prm=llm_judge`).

It is *not* a trained process reward model: accuracies obtained with it are not the papers'
numbers (docs/real-pair.md). Its prompt and reading: docs/step-level.md "Process reward models".
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from rstitch.engines import load_scoring_model
from rstitch.errors import ConfigError
from rstitch.scorers.prefix_cache import PrefixCachedScorer
from rstitch.scorers.prm import ProcessRewardModel

JUDGE_QUESTION = (
    "Is the last step of your solution above correct (right arithmetic and valid logic)? "
    "Answer with Yes or No only."
)
ANSWERS = ("Yes", "No")


class LLMJudgePRM(ProcessRewardModel):
    def __init__(self, path: str, device: str = "cpu", dtype: str = "float32", separator: str = "\n\n",
                 question: str = JUDGE_QUESTION, engine: str | None = None, num_threads: int | None = None):
        super().__init__()
        # Two tokens' probabilities: an engine whose distributions are exact over the vocabulary.
        runner = load_scoring_model(engine, path, "PRM llm_judge (it reads the probabilities of Yes and No)",
                                    ("exact_distributions",), dtype=dtype, device=device, num_threads=num_threads)
        tokenizer = runner.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"PRM llm_judge: the tokenizer of '{path}' has no chat template (it needs an instruct model)")
        self.name = "llm_judge"
        self.tokenizer, self.separator, self.question = tokenizer, separator, question
        answers = [tokenizer.encode(a, add_special_tokens=False) for a in ANSWERS]
        for text, ids in zip(ANSWERS, answers):
            if len(ids) != 1:
                raise ConfigError(f"PRM llm_judge: '{text}' is not a single token of the tokenizer of '{path}'")
        self.answer_ids = [ids[0] for ids in answers]
        self.scorer = PrefixCachedScorer(runner, lambda dists: torch.stack([d.logits[self.answer_ids] for d in dists]))
        self.cost = runner.cost
        self.num_parameters = runner.num_parameters
        self._problem: str | None = None
        self._memo: dict[tuple[str, ...], float] = {}

    def score(self, problem: str, steps: Sequence[str]) -> list[float]:
        if problem != self._problem:  # a new sample: earlier memos can never be asked again
            self._problem, self._memo = problem, {}
        scores = []
        for i in range(len(steps)):
            key = tuple(steps[: i + 1])
            if key not in self._memo:
                logits = self.scorer.last_row(self.prompt_ids(problem, key))
                self._memo[key] = float(torch.softmax(logits, dim=-1)[0])
            scores.append(self._memo[key])
        return scores

    def prompt_ids(self, problem: str, steps: Sequence[str]) -> list[int]:
        """The judge's input for the last of `steps`; its next token is the answer."""
        messages = [
            {"role": "user", "content": problem},
            {"role": "assistant", "content": self.separator.join(steps)},
            {"role": "user", "content": self.question},
        ]
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)
