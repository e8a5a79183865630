"""What every engine reads from a checkpoint besides its weights (engines/loading.py)."""
from __future__ import annotations

import pytest

from rstitch.engines import load_model
from rstitch.engines.loading import eos_token_ids, generation_eos, load_tokenizer, model_load_errors, model_specs, shared_vocab_size
from rstitch.errors import ConfigError
from rstitch.testbed import SLM_DIR


class Tok:
    eos_token_id = 2

    def __len__(self) -> int:
        return 470


def test_eos_ids_merge_the_tokenizer_and_every_source():
    assert eos_token_ids(Tok(), None, 5, [7, 2], []) == [2, 5, 7]


def test_shared_vocabulary_is_the_smaller_of_tokenizer_and_model():
    assert shared_vocab_size(Tok(), 512) == 470 and shared_vocab_size(Tok(), 400) == 400


def test_model_options_merge_shared_then_per_model_then_the_models_own():
    models = {"slm": {"path": "s", "dtype": "float16"}, "llm": {"path": "l"}}
    shared = {"dtype": "float32", "compile": "off", "per_model": {"llm": {"compile": "graphs", "path": "ignored"}}}
    assert model_specs(models, shared) == {"slm": {"path": "s", "dtype": "float16", "compile": "off"},
                                           "llm": {"path": "l", "dtype": "float32", "compile": "graphs"}}
    assert "per_model" in shared  # the caller's options are left as they were
    with pytest.raises(ConfigError, match=r"unknown model keys \['prm'\]; valid: slm, llm"):
        model_specs(models, {"per_model": {"prm": {}}})


def test_the_testbed_checkpoint_reads_as_every_engine_reads_it():
    tokenizer = load_tokenizer(str(SLM_DIR))
    model = load_model("hf", str(SLM_DIR))
    assert model.eos_token_ids == eos_token_ids(tokenizer, generation_eos(str(SLM_DIR)))
    assert model.vocab_size == shared_vocab_size(tokenizer, model.model.config.vocab_size) == len(tokenizer)
    assert load_tokenizer(str(SLM_DIR), tokenizer) is tokenizer  # a given tokenizer is used as is


def test_a_checkpoint_that_cannot_be_read_is_one_config_error(tmp_path):
    with pytest.raises(ConfigError, match=f"cannot load model '{tmp_path}': no config here$"):
        with model_load_errors(str(tmp_path)):
            raise OSError("no config here\nsecond line of detail")
    (tmp_path / "config.json").write_text((SLM_DIR / "config.json").read_text())  # a config without weights
    with pytest.raises(ConfigError, match="cannot load model"):
        load_model("hf", str(tmp_path), tokenizer=load_tokenizer(str(SLM_DIR)))
