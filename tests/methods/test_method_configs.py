"""Every conf/method/*.yaml composes as `rstitch-run method=<name>` would, names only parameters its
method's constructor takes (and every one it requires), and builds on CPU."""
from __future__ import annotations

import inspect

import pytest

from rstitch.cli.run import CONF_DIR, compose_config
from rstitch.methods import Method, build_method
from rstitch.methods.base import METHODS

METHOD_CONFIGS = sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))


def constructor_parameters(cls: type[Method]) -> dict[str, inspect.Parameter]:
    """The keyword parameters `cls(...)` accepts, following `**kwargs` up to the base classes
    whose `__init__` receives them (e.g. the step caps of `DraftVerifyMethod`)."""
    accepted: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = list(inspect.signature(klass.__init__).parameters.values())[1:]  # without self
        accepted.update({p.name: p for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
                         and p.name not in accepted})
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return accepted


def test_every_registered_method_has_a_config():
    assert set(METHOD_CONFIGS) == set(METHODS)


@pytest.mark.parametrize("config_name", METHOD_CONFIGS)
def test_method_config_matches_its_constructor_and_builds(config_name):
    config = compose_config(["logger=none", f"method={config_name}"])["method"]
    name = config.pop("name")
    assert name == config_name  # the file name is the name `method=` selects
    params = constructor_parameters(METHODS[name])
    assert sorted(set(config) - set(params)) == [], f"keys {name}'s constructor does not take"
    required = {k for k, p in params.items() if p.default is p.empty}
    assert sorted(required - set(config)) == [], f"parameters {name} requires that its config leaves out"
    method = build_method(name, **config)
    assert isinstance(method, METHODS[name])


def test_constructor_parameters_follow_kwargs_to_the_base_class():
    class Base(Method):
        def __init__(self, shared: int = 1):
            self.shared = shared

    class Child(Base):
        def __init__(self, own: float, **kwargs):
            super().__init__(**kwargs)

    assert list(constructor_parameters(Child)) == ["own", "shared"]
    assert list(constructor_parameters(Base)) == ["shared"]
