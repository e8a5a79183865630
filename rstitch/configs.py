"""Where the Hydra configs live: `conf/` in a checkout (or editable install), `rstitch/conf/` in a wheel (setup.py)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def find_conf_dir() -> Path:
    """The packaged copy first: beside an installed package, `../conf` is site-packages/conf."""
    for candidate in (_PACKAGE / "conf", _PACKAGE.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise RuntimeError(f"rstitch's configs are missing: neither {_PACKAGE / 'conf'} nor {_PACKAGE.parent / 'conf'} "
                       "holds config.yaml; reinstall the package")


CONF_DIR = find_conf_dir()


def override_key(override: str) -> str:
    """The key a Hydra override sets: `x` for `x=1`, `+x=1`, `~x` or `++x=1`."""
    return override.lstrip("+~").split("=", 1)[0]


def override_value(overrides: Sequence[str], key: str) -> str | None:
    """The value a command line's overrides set `key` to (the last one wins, as in Hydra); None if none does."""
    values = [o.split("=", 1)[1] for o in overrides if "=" in o and override_key(o) == key]
    return values[-1] if values else None
