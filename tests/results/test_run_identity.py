"""Run identity is pinned: the directory names and comparison-key hashes of existing configs,
computed before the run layout and key fields moved into one module, must not change (a changed
name would orphan every stored run and its baseline)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rstitch.cli.run import compose_config
from rstitch.configs import CONF_DIR
from rstitch.results import keys
from rstitch.results.keys import RUN_KEY_FIELDS, comparison_key, run_dir, run_key, run_tag, short_hash
from rstitch.results.keys import comparison_dir as comparison_root

# overrides -> (run directory under results_root, comparison-key hash), from the code before the move
PINNED = [
    ([], "testbed/testbed/rstitch/tau=0.02_0b595337", "6be76c51"),
    (["method=llm_only"], "testbed/testbed/llm_only/03b819f8", "6be76c51"),
    (["method=rsd"], "testbed/testbed/rsd/alpha=10.0_delta=0.7_max_repeats=5_max_step_tokens=1024_max_steps=512_p=0.5_seed=0_"
     "weighting=binary_f81ca936", "6be76c51"),
    # The router's weights are part of the run key (their fingerprint): the retrained router
    # (under Algorithm 1) has new runs, as it decodes differently
    (["method=rstitch_plus"], "testbed/testbed/rstitch_plus/latency_dir=latency_router=rstitch_router_sample_router=False_seed=0_"
     "tau=None_45441b22", "6be76c51"),
    # SpecReason's judge_context (added with the judge on the base model's own sequence) is a new
    # method parameter: its runs have new directories, as their judge costs differ
    (["method=specreason", "batch_size=4"], "testbed/testbed/specreason/first_n_by_base=0_judge_context=reasoning_max_repeats=5_"
     "max_step_tokens=1024_max_steps=512_score_mode=greedy_threshold=7_batch=4_442b2b07", "7076847c"),
    (["method=easd", "dataset.num_shards=2", "dataset.shard=1"], "testbed/testbed/easd/k=5_tau_h=auto_tau_o=0.8_top_n=5_"
     "use_draft_entropy=True_use_overlap=True_shard=1of2_fc560d7b", "89226760"),
    (["method=arbitrage", "on_overflow=truncate", "max_new_tokens=64"], "testbed/testbed/arbitrage/max_repeats=5_max_step_tokens=1024_"
     "max_steps=512_tau=0.5_203c7a3c", "ac78e992"),
]


@pytest.mark.parametrize(("overrides", "expected_dir", "key_hash"), PINNED, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_run_directory_and_key_of_existing_configs_unchanged(overrides, expected_dir, key_hash):
    cfg = compose_config(["logger=none", "results_root=runs", *overrides])
    assert run_dir(cfg["results_root"], cfg) == Path("runs") / expected_dir
    assert comparison_root(cfg["results_root"], cfg) / cfg["method"]["name"] / run_tag(cfg) == Path("runs") / expected_dir
    assert keys.run_name(cfg) == expected_dir
    assert short_hash(comparison_key(cfg)) == key_hash


def test_the_run_key_reads_only_the_declared_fields():
    """The Hydra resolver hands the key RUN_KEY_FIELDS only: a field the key reads but the list
    misses would let two configs share a directory (or fail to resolve)."""
    cfg = compose_config(["logger=none", "method=rsd", "batch_size=2", "on_overflow=truncate"])
    assert run_key({k: cfg[k] for k in RUN_KEY_FIELDS}) == run_key(cfg)
    for field in ("max_new_tokens", "n_samples", "batch_size"):
        assert run_key({**cfg, field: cfg[field] + 1}) != run_key(cfg)


@pytest.mark.parametrize(("overrides", "run_dir", "key_hash"), PINNED[:1] + PINNED[4:6])
def test_hydra_run_dir_is_the_runner_s(overrides, run_dir, key_hash):
    """The directory Hydra creates for `rstitch-run` (conf/config.yaml, single run and sweep) is
    the one the runner and the scripts compute."""
    import rstitch.cli.run  # noqa: F401  (registers the resolvers the Hydra config reads)

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["logger=none", "results_root=runs", *overrides], return_hydra_config=True)
    run = OmegaConf.select(cfg, "hydra.run.dir")
    sweep = Path(OmegaConf.select(cfg, "hydra.sweep.dir")) / OmegaConf.select(cfg, "hydra.sweep.subdir")
    assert Path(run) == sweep == Path("runs") / run_dir


def test_the_shown_tag_names_only_settings_that_differ_from_the_method_defaults():
    from rstitch.results.keys import settings_tag
    from rstitch.results.summary import format_table

    rsd = compose_config(["method=rsd"])
    assert len(run_tag(rsd)) > 100  # every knob: the run directory keeps it, so stored runs resume where they are
    assert settings_tag(rsd) == short_hash(run_key(rsd))  # RSD at its defaults: the hash alone
    swept = compose_config(["method=rsd", "method.delta=0.9", "method.weighting=logistic"])
    assert settings_tag(swept) == f"delta=0.9_weighting=logistic_{short_hash(run_key(swept))}"
    assert settings_tag(compose_config(["method=rsd", "prm=oracle"])) != settings_tag(rsd)  # the PRM: in the hash
    plus = compose_config(["method=rstitch_plus"])
    assert settings_tag(plus) == short_hash(run_key(plus))  # asset paths by interpolation are defaults too
    header, row = format_table({"method": "rsd", "run_tag": run_tag(swept), "setting_tag": settings_tag(swept)}).splitlines()
    assert row.split()[1] == settings_tag(swept) and len(run_tag(swept)) - len(settings_tag(swept)) > 60
    assert format_table({"method": "rsd", "run_tag": "old_tag"}).splitlines()[1].split()[1] == "old_tag"  # older summaries
