"""rstitch/registry.py: the one registration mechanism (methods, datasets, PRMs)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from rstitch.errors import ConfigError
from rstitch.registry import Registry


class Widget:
    def __init__(self, size: int, colour: str = "red"):
        self.size, self.colour = size, colour


def test_unknown_names_fail_with_the_valid_list_and_aliases_resolve():
    registry: Registry[type] = Registry("widget")
    registry.register("box", Widget, aliases=("crate",))
    registry.register("lazy", "collections:OrderedDict")
    assert registry.get_entry("crate") is Widget and registry.canonical("crate") == "box"
    with pytest.raises(ConfigError, match=r"^unknown widget 'nope'; valid: box, lazy$"):
        registry.get_entry("nope")
    with pytest.raises(ConfigError, match="unknown widget"):
        registry.canonical({"not": "a name"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("box", Widget)


def test_build_checks_parameters_once_for_every_kind():
    registry: Registry[type] = Registry("widget")
    registry.register("box", Widget)
    assert registry.build("box", size=3).size == 3
    with pytest.raises(ConfigError, match=r"^widget 'box': got an unexpected keyword argument 'weight'$"):
        registry.build("box", size=3, weight=1)
    with pytest.raises(ConfigError, match=r"^widget 'box': missing a required argument: 'size'$"):
        registry.build("box")


def test_lazy_entries_are_imported_and_validated_at_first_use():
    seen = []
    registry: Registry[type] = Registry("widget", validate=lambda name, entry: seen.append((name, entry)))
    registry.register("ordered", "collections:OrderedDict")
    assert seen == []
    from collections import OrderedDict

    assert registry["ordered"] is OrderedDict and seen == [("ordered", OrderedDict)]


def test_importing_the_methods_loads_no_method_module_until_a_lookup():
    code = ("import sys, rstitch.methods as m; assert 'rstitch.methods.rsd' not in sys.modules; "
            "m.method_class('rsd'); assert 'rstitch.methods.rsd' in sys.modules; print(sorted(m.METHODS)[:2])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['arbitrage', 'arbitrage_oracle']"
