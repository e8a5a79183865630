"""The one registration mechanism: methods, datasets, engines and PRMs are named entries of a
`Registry`, lazy (an entry may be a "module:attribute" string imported at first use, so heavy
dependencies load only when used) and loud (an unknown name or parameter is one `ConfigError` line)."""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, Generic, TypeVar

from rstitch.errors import ConfigError

T = TypeVar("T")


class Registry(MutableMapping[str, T], Generic[T]):
    """name -> entry. `kind` names the entries in error lines ("method", "dataset", "PRM");
    `modules` register entries when imported; `validate(name, entry)` checks each entry;
    `replace` allows a name to be registered again (the later entry wins)."""

    def __init__(self, kind: str, modules: tuple[str, ...] = (), validate: Callable[[str, T], None] | None = None,
                 replace: bool = False) -> None:
        self.kind = kind
        self._modules = modules
        self._validate = validate
        self._replace = replace
        self._entries: dict[str, T | str] = {}
        self._aliases: dict[str, str] = {}
        self._loaded = not modules

    def register(self, name: str, entry: T | str, aliases: tuple[str, ...] = ()) -> T | str:
        """Add `entry` (or a lazy "module:attribute" string) as `name` and its aliases."""
        if name in self._entries and not self._replace:
            raise ValueError(f"{self.kind} '{name}' registered twice")
        if self._validate is not None and not isinstance(entry, str):
            self._validate(name, entry)
        self._entries[name] = entry
        for alias in aliases:
            self._aliases[alias] = name
        return entry

    def decorator(self, name: str) -> Callable[[T], T]:
        """`@registry.decorator("name")` on a class or function registers it."""
        def wrap(entry: T) -> T:
            self.register(name, entry)
            return entry
        return wrap

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True  # first: a module that reads the registry while it registers sees what is there so far
            for module in self._modules:
                importlib.import_module(module)

    def canonical(self, name: str) -> str:
        """The registered name of `name` or of its alias; a ConfigError listing the valid names if none."""
        self._load()
        name = self._aliases.get(name, name) if isinstance(name, str) else name
        if not isinstance(name, str) or name not in self._entries:
            raise ConfigError(f"unknown {self.kind} '{name}'; valid: {', '.join(sorted(self._entries))}")
        return name

    def get_entry(self, name: str) -> T:
        """The entry of `name` (or of an alias), imported now if it was registered lazily."""
        name = self.canonical(name)
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attribute = entry.partition(":")
            loaded: T = getattr(importlib.import_module(module), attribute)
            if self._validate is not None:
                self._validate(name, loaded)
            self._entries[name] = entry = loaded
        return entry

    def build(self, name: str, /, **params: Any) -> Any:
        """`entry(**params)` after checking `params` against its signature: a missing or unknown
        parameter is one ConfigError line; a TypeError raised inside the constructor is a bug of
        the entry and propagates as one."""
        entry = self.get_entry(name)
        try:
            check_parameters(entry, params)  # type: ignore[arg-type]
        except TypeError as err:
            raise ConfigError(f"{self.kind} '{name}': {err}") from None
        return entry(**params)  # type: ignore[operator]

    def __getitem__(self, name: str) -> T:
        self._load()
        if name not in self._entries:  # the mapping holds registered names only, not aliases
            raise KeyError(name)
        return self.get_entry(name)

    def __setitem__(self, name: str, entry: T) -> None:
        self._load()
        self._entries[name] = entry

    def __delitem__(self, name: str) -> None:
        self._load()
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries


def check_parameters(cls: Callable[..., Any], params: dict[str, Any]) -> None:
    """Raise TypeError for a missing or unknown parameter of `cls(**params)`, by signature. Options
    passed on by `**options` to a base class's __init__ (step-level methods) are checked there."""
    inspect.signature(cls).bind(**params)
    if not isinstance(cls, type):
        return  # a function: its signature is the whole story
    allowed: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = list(inspect.signature(vars(klass)["__init__"]).parameters.values())[1:]  # without self
        allowed |= {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise TypeError(f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                        f"valid: {', '.join(sorted(allowed))}")
