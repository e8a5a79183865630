"""Errors that reach the user as one clear line."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class ConfigError(ValueError):
    """A bad configuration or input: unknown name, missing path, wrong type, bad record."""


@contextmanager
def exit_on_config_error(prog: str | None = None) -> Iterator[None]:
    """A `ConfigError` inside leaves the program as one line, ``<prog>: error: <why>``, with argparse's
    exit status 2: ``@exit_on_config_error()`` on a command's or script's ``main``."""
    try:
        yield
    except ConfigError as err:
        print(f"{prog or Path(sys.argv[0]).name}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
