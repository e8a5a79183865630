"""Turning a problem into prompt token ids, per model family (config group `prompt/`)."""
from __future__ import annotations

from dataclasses import dataclass

from rstitch.errors import ConfigError


@dataclass(frozen=True)
class PromptFormat:
    """`chat`: the tokenizer's chat template with optional system prompt and user suffix;
    `plain`: `template.format(problem=...)` with no template. `assistant_prefix` (e.g. R1's
    "<think>\\n") is added after the generation prompt unless the template already ends with it."""

    name: str = "chat"
    style: str = "chat"  # "chat" | "plain"
    system: str | None = None
    user_suffix: str = ""
    assistant_prefix: str = ""
    template: str = "{problem}"

    def render(self, tokenizer, problem: str) -> str:
        if self.style == "plain":
            return self.template.format(problem=problem) + self.assistant_prefix
        if self.style != "chat":
            raise ConfigError(f"unknown prompt style '{self.style}'; valid: chat, plain")
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"prompt '{self.name}' needs a chat template, and the tokenizer has none; use prompt=plain")
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": problem + self.user_suffix})
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if self.assistant_prefix and not text.endswith(self.assistant_prefix):
            text += self.assistant_prefix
        return text

    def encode(self, tokenizer, problem: str) -> list[int]:
        return tokenizer.encode(self.render(tokenizer, problem), add_special_tokens=self.style == "plain")
