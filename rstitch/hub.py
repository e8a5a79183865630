"""The one place that probes and reads the Hugging Face hub. Each probe is one short request before a
client's own retries (five, each warning logged twice under Hydra), so without network a run stops
with one error line at once."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rstitch.errors import ConfigError

PROBE_TIMEOUT_S = 10.0
LOCAL_COPY_HINT = "pass dataset.path=<a local .jsonl copy> (scripts/export_benchmarks.py writes them, online, once)"
OFFLINE_HINT = "pass a local model directory, or with no network set HF_HUB_OFFLINE=1 to use models already in the hub cache"
_REACHED: set[tuple[str, str | None]] = set()  # datasets probed in this process (MMLU-Redux reads 57 configs)


def offline() -> bool:
    """HF_HUB_OFFLINE as the hub client reads it (1, true, yes, on)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def dataset_hint(is_offline: bool) -> str:
    """What to do about a dataset the hub did not give, for the environment at hand."""
    if is_offline:
        return f"HF_HUB_OFFLINE is set and the hub cache has no copy: run once with network to cache it, or {LOCAL_COPY_HINT}"
    return f"{LOCAL_COPY_HINT}, or, without network, set HF_HUB_OFFLINE=1 to read the copy an earlier online run cached"


def check_hub_model(repo_id: str, revision: str | None = None) -> None:
    """One error line, before any download, when a hub model is neither cached nor reachable."""
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(huggingface_hub.try_to_load_from_cache(repo_id, "config.json", revision=revision), str):
        return
    if offline():
        raise ConfigError(f"model '{repo_id}' is not a local directory and not in the hub cache (HF_HUB_OFFLINE is set); "
                          "pass a local model directory, or run once with network to cache it")
    try:
        huggingface_hub.model_info(repo_id, revision=revision, timeout=PROBE_TIMEOUT_S)
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise ConfigError(f"model '{repo_id}' is not a local directory and not on the hub (at revision {revision or 'main'})") from None
    except Exception as err:  # noqa: BLE001 - no network, proxy, DNS: all the same to the user
        raise ConfigError(f"cannot reach the Hugging Face hub for model '{repo_id}' ({type(err).__name__}); {OFFLINE_HINT}") from None


def read_dataset(name: str, hub_id: str, config: str | None, split: str, revision: str | None) -> list[dict[str, Any]]:
    """The rows of one hub dataset config and split; one error line when the hub is unreachable or refuses."""
    import datasets
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    where = f"{hub_id}" + (f" ({config})" if config else "") + f" split {split} @ {revision}"
    is_offline = offline()
    if not is_offline and (hub_id, revision) not in _REACHED:
        try:
            huggingface_hub.dataset_info(hub_id, revision=revision, timeout=PROBE_TIMEOUT_S)
            _REACHED.add((hub_id, revision))
        except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError):
            pass  # reachable: `datasets` says what is wrong (a gated set needs a token), or reads the cache
        except Exception as err:  # noqa: BLE001 - no network, proxy, DNS: all the same to the user
            raise ConfigError(f"cannot load dataset '{name}' from the hub: {where}: the hub is unreachable "
                              f"({type(err).__name__}); {dataset_hint(False)}") from None
    try:
        table = datasets.load_dataset(hub_id, config, split=split, revision=revision)
    except Exception as err:  # noqa: BLE001 - network, auth (gated sets) and missing-revision errors alike
        raise ConfigError(f"cannot load dataset '{name}' from the hub: {where}: {first_line(err)}; {dataset_hint(is_offline)}") from None
    return [dict(row) for row in table]


def first_line(err: BaseException) -> str:
    """An error's first line (its type where it has no text): the reason an error line quotes."""
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def download_file(repo_id: str, filename: str, revision: str, local_dir: Path, hint: str) -> Path:
    """One file of a hub repository at `revision`, into `local_dir`; one error line (ending in `hint`) when it fails."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, local_dir=local_dir))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
        raise ConfigError(f"downloading {repo_id}@{revision[:12]}/{filename} failed ({first_line(err)[:200]}); {hint}") from None
