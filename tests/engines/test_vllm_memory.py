"""KV pools of equal token capacity for a pair on one GPU (`engines/vllm_memory.py`): pure
arithmetic on the models' shapes, so no GPU and no vLLM."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from rstitch.engines.vllm_memory import GIB, ModelMemory, check_run, kv_bytes_per_token, model_memory, plan
from rstitch.errors import ConfigError

# The shapes of DeepSeek-R1-Distill-Qwen 1.5B and 7B (config.json): grouped-query KV heads.
SMALL = SimpleNamespace(num_attention_heads=12, num_key_value_heads=2, hidden_size=1536, num_hidden_layers=28)
LARGE = SimpleNamespace(num_attention_heads=28, num_key_value_heads=4, hidden_size=3584, num_hidden_layers=28)
PAIR = [model_memory("slm", SMALL, 1_780_000_000, "bfloat16"), model_memory("llm", LARGE, 7_620_000_000, "bfloat16")]


def test_kv_bytes_per_token_counts_keys_and_values_of_every_layer_per_kv_head():
    assert kv_bytes_per_token(SMALL, "bfloat16") == 2 * 28 * 2 * 128 * 2
    assert kv_bytes_per_token(LARGE, "float32") == 2 * 28 * 4 * 128 * 4
    mha = SimpleNamespace(num_attention_heads=4, hidden_size=128, num_hidden_layers=2, head_dim=None)
    assert kv_bytes_per_token(mha, "float32") == 2 * 2 * 4 * 32 * 4  # no KV heads given: one per head


def test_both_pools_hold_the_same_tokens_and_everything_fits():
    gpu = 80 * GIB
    tokens = plan(gpu, PAIR, batch_size=8, max_len=20480)
    used = sum(m.weight_bytes + 2 * GIB + tokens * m.kv_bytes_per_token for m in PAIR)
    assert tokens >= 8 * 20480 and used <= 0.9 * gpu
    assert used + sum(m.kv_bytes_per_token for m in PAIR) > 0.9 * gpu  # and nothing is left unused
    # the fixed shares' pools (0.15 and 0.65 of the GPU, the old default) differ by ~2.4x in tokens
    fixed = [(share * gpu - m.weight_bytes - 2 * GIB) / m.kv_bytes_per_token for share, m in zip((0.15, 0.65), PAIR)]
    assert fixed[1] / fixed[0] > 2


@pytest.mark.parametrize("gpu_gib, batch, length", [(24, 64, 32768), (16, 1, 1024)])
def test_a_pair_that_cannot_fit_is_refused_in_one_line(gpu_gib, batch, length):
    with pytest.raises(ConfigError) as err:
        plan(gpu_gib * GIB, PAIR, batch_size=batch, max_len=length)
    message = str(err.value)
    assert "\n" not in message and f"batch {batch} x {length}" in message and "slm + llm" in message


def test_one_model_check_uses_the_same_arithmetic():
    tiny = ModelMemory("m", weight_bytes=GIB, kv_bytes_per_token=1024)
    assert plan(4 * GIB, [tiny], 1, 1000, utilization=1.0) == (4 * GIB - 3 * GIB) // 1024
    with pytest.raises(ConfigError, match="room for 0 tokens"):
        plan(3 * GIB, [tiny], 1, 1, utilization=1.0)


def test_a_run_is_checked_against_its_batch_and_length():
    """`check_run`: both pools hold batch x length tokens; kv_tokens below it is one line."""
    assert check_run(PAIR, 4, 1000, None, None) == 4000
    assert check_run(PAIR, 4, 1000, 4000, None) == 4000
    with pytest.raises(ConfigError) as err:
        check_run(PAIR, 4, 1000, 3999, None)
    assert "\n" not in str(err.value) and "batch 4 x 1000 (4000)" in str(err.value)
    # on an 80 GiB GPU: equal pools sized by plan for the run; a 16 GiB one refuses a long batch
    assert check_run(PAIR, 8, 20480, None, 80 * GIB) == plan(80 * GIB, PAIR, 8, 20480)
    with pytest.raises(ConfigError, match="batch 64 x 32768"):
        check_run(PAIR, 64, 32768, None, 16 * GIB)
    with pytest.raises(ConfigError, match="batch 1 x 2000000"):
        check_run(PAIR, 1, 1000, 2_000_000, 16 * GIB)
