"""The shared tokenizer of the testbed models: a digit-wise byte-level BPE with a chat template
(docs/testbed.md, "Tokenizer")."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from rstitch.judge_prompt import JUDGE_INSTRUCTION, JUDGE_PREFIX

from . import TOKENIZER_DIR
from .corruption import corrupt_steps
from .problems import STEP_SEPARATOR, STYLES, generate_problems

# eos (also bos), pad, then the chat roles of CHAT_TEMPLATE
EOS_TOKEN, PAD_TOKEN, *ROLE_TOKENS = SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|user|>", "<|assistant|>", "<|system|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>\n{{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}<|user|>\n{{ message['content'] }}\n"
    "{% elif message['role'] == 'assistant' %}<|assistant|>\n{{ message['content'] }}<|endoftext|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def tokenizer_corpus(n_problems: int = 3000, seed: int = 0) -> list[str]:
    """Texts the BPE is trained on: problems, solutions in both styles, corrupted ones, the judge's strings."""
    rng = random.Random(seed)
    texts = [JUDGE_INSTRUCTION, JUDGE_PREFIX] * 200
    for p in generate_problems("train", n_problems, seed=seed):
        texts += [p.problem, *(p.solution(style) for style in STYLES), STEP_SEPARATOR.join(corrupt_steps(p, rng.choice(STYLES), rng))]
    return texts


def train_tokenizer(texts: Iterable[str] | None = None, vocab_size: int = 640) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE and wrap it as a ``PreTrainedTokenizerFast``."""
    texts = list(texts) if texts is not None else tokenizer_corpus()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\n+"), behavior="isolated"),
            # every digit is its own piece; a space before a number stays attached
            # to its first digit (" 4", "7"), so numbers are read digit by digit
            pre_tokenizers.Split(Regex(r" ?[0-9]"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS_TOKEN, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                   additional_special_tokens=ROLE_TOKENS,
                                   clean_up_tokenization_spaces=False, model_max_length=1024)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tokenizer(out_dir: str | Path | None = None):
    """Train the tokenizer (deterministic) and save it to ``out_dir`` if given."""
    tok = train_tokenizer()
    if out_dir is not None:
        tok.save_pretrained(str(out_dir))
    return tok


def load_tokenizer(path: str | Path | None = None):
    """Load the shared tokenizer (default: the shipped ``assets/tokenizer``)."""
    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR if path is None else path))


def render_prompt(tokenizer, problem: str) -> str:
    """The generation prompt of a problem (chat template, generation prompt added)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": problem}], add_generation_prompt=True, tokenize=False)
