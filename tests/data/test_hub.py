"""rstitch.hub: one probe, with a short timeout, before a hub client starts its own retries."""
from __future__ import annotations

import pytest

from rstitch import hub
from rstitch.errors import ConfigError


@pytest.fixture
def online(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "_REACHED", set())


def test_a_dataset_is_probed_once_for_all_its_configs(monkeypatch, online):
    import datasets
    import huggingface_hub

    probes, loads = [], []
    monkeypatch.setattr(huggingface_hub, "dataset_info", lambda repo, **kw: probes.append((repo, kw["timeout"])))
    monkeypatch.setattr(datasets, "load_dataset", lambda repo, config, **kw: loads.append(config) or [{"q": config}])
    rows = hub.read_dataset("set", "org/set", "a", "test", "abc") + hub.read_dataset("set", "org/set", "b", "test", "abc")
    assert rows == [{"q": "a"}, {"q": "b"}] and loads == ["a", "b"]
    assert probes == [("org/set", hub.PROBE_TIMEOUT_S)]


def test_an_unreachable_hub_is_one_line_for_models_and_datasets(monkeypatch, online):
    import huggingface_hub

    def unreachable(*args, **kwargs):
        raise ConnectionError("no route\nmore")

    monkeypatch.setattr(huggingface_hub, "dataset_info", unreachable)
    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *args, **kwargs: None)
    with pytest.raises(ConfigError, match="the hub is unreachable") as dataset_err:
        hub.read_dataset("set", "org/set", None, "test", "abc")
    with pytest.raises(ConfigError, match="cannot reach the Hugging Face hub for model 'org/model'") as model_err:
        hub.check_hub_model("org/model")
    assert "\n" not in str(dataset_err.value) + str(model_err.value)
    assert "dataset.path=" in str(dataset_err.value) and "HF_HUB_OFFLINE=1" in str(model_err.value)


def test_offline_a_model_outside_the_cache_is_one_line_without_a_request(monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *args, **kwargs: None)
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *args, **kwargs: pytest.fail("no request offline"))
    with pytest.raises(ConfigError, match="not in the hub cache \\(HF_HUB_OFFLINE is set\\)"):
        hub.check_hub_model("org/model")
    assert "HF_HUB_OFFLINE is set" in hub.dataset_hint(True) and "HF_HUB_OFFLINE=1" in hub.dataset_hint(False)
