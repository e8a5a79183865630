"""Everything a GPU session (scripts/gpu_session.sh) imports, checked before any section runs, so that
a missing package costs one line and seconds, not a traceback minutes into the session:

* the installed version of each package the session imports, against the project's range
  (pyproject.toml) and transformers' own requirements (what `pip install --no-deps` skips);
* each module the sections import: the benchmark script, the GPU tests and their conftest, and
  what rstitch imports lazily while decoding (transformers' model classes, math_verify, greenlet);
* with `--device cuda`, that torch sees a CUDA device; `--files` that the bundle's paths exist.

    python3 scripts/gpu_preflight.py --device cuda --files .gpu/tok

Prints one line: `preflight: ok ...` (exit 0), or `preflight: ...` naming every problem found
(exit 2). Standard library only, so that it runs where anything else may be missing.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import importlib.util
import io
import re
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The distributions of pyproject.toml's dependencies that the session's sections import (datasets,
# W&B, figures and the code sandbox are not used there), and pytest for its tests.
SESSION_DISTRIBUTIONS = ("torch", "transformers", "tokenizers", "safetensors", "huggingface-hub", "hydra-core", "omegaconf",
                         "pandas", "numpy", "tqdm", "greenlet", "math-verify", "pebble", "pyyaml", "pytest")
MODULE_NAMES = {"hydra-core": "hydra", "pyyaml": "yaml", "math-verify": "math_verify"}  # else the name with "_" for "-"
# What the sections import besides their files' own imports: modules rstitch loads inside functions.
LAZY_MODULES = ("transformers", "math_verify", "pebble", "greenlet", "hydra", "omegaconf", "rstitch.engines.hf", "rstitch.engines.hf_static",
                "rstitch.grading")
TRANSFORMERS_CLASSES = ("AutoTokenizer", "AutoModelForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "GenerationConfig")
# The files the sections run, imported as the session imports them (tests/ on the path for conftest).
ENTRY_FILES = ("scripts/bench_gpu.py", "tests/conftest.py", "tests/engines/test_gpu_paths.py", "tests/engines/test_static_cache.py")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return canonical(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0])


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def project_requirements() -> dict[str, str]:
    """name -> requirement string, from pyproject.toml's dependencies and its dev extra."""
    import tomllib  # Python 3.11+ (the GPU machine's is 3.12); main() names an older one in one line

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    return {requirement_name(line): line for line in lines}


def version_problems() -> tuple[list[str], list[str]]:
    """The session's packages that are not installed, and those outside their range (with
    transformers' own requirements; ranges need `packaging`, without it presence only)."""
    wanted = project_requirements()
    requirements = [wanted.get(name, name) for name in SESSION_DISTRIBUTIONS]
    if installed_version("transformers"):
        requirements += [r for r in metadata.requires("transformers") or [] if "extra ==" not in r]
    try:
        from packaging.requirements import Requirement
    except ImportError:
        names = [requirement_name(r) for r in requirements]
        return [name for name in dict.fromkeys(["packaging", *names]) if installed_version(name) is None], []
    missing: dict[str, None] = {}
    out_of_range: dict[str, str] = {}
    for line in requirements:
        requirement = Requirement(line)
        name = canonical(requirement.name)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        version = installed_version(name)
        if version is None:
            missing[name] = None
        elif requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            out_of_range.setdefault(name, f"{name} {version} (needs {requirement.specifier})")
    return list(missing), list(out_of_range.values())


def import_problems(missing: set[str]) -> list[str]:
    """Modules that fail to import, except for a module of a distribution already named; the
    targets that fail alike are named together."""
    missing_modules = {MODULE_NAMES.get(name, name.replace("-", "_")) for name in missing}
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    failing: dict[str, list[str]] = {}  # error -> targets
    for target in [*LAZY_MODULES, *(f"transformers:{name}" for name in TRANSFORMERS_CLASSES), *ENTRY_FILES]:
        try:
            with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
                load(target)
        except ModuleNotFoundError as err:
            if (err.name or "").split(".")[0] not in missing_modules:
                failing.setdefault(str(err), []).append(target)
        except Exception as err:  # noqa: BLE001 - any failure to import is what the line reports
            failing.setdefault(f"{type(err).__name__}: {first_line(err)}", []).append(target)
    return [f"{', '.join(targets)}: {error}" for error, targets in failing.items()]


def load(target: str) -> None:
    if target in ENTRY_FILES:
        path = ROOT / target
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None, f"{path} is not a Python file"
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)
        spec.loader.exec_module(module)
    elif ":" in target:
        module_name, attribute = target.split(":")
        getattr(importlib.import_module(module_name), attribute)
    else:
        importlib.import_module(target)


def device_problems(device: str) -> list[str]:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return [f"no CUDA device visible to torch {torch.__version__} (CUDA build: {torch.version.cuda})"]
    return []


def summary(device: str) -> str:
    import torch
    import transformers

    where = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return (f"torch {torch.__version__} on {where}, transformers {transformers.__version__}, "
            f"python {sys.version.split()[0]}")


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--files", nargs="*", default=[], help="paths the session reads (the bundle's tokenizer)")
    args = p.parse_args(argv)
    if sys.version_info < (3, 11):
        print(f"preflight: needs Python 3.11 or newer (tomllib), this is {sys.version.split()[0]}", flush=True)
        return 2
    problems = [f"{path} not found" for path in args.files if not Path(path).exists()]
    missing, out_of_range = version_problems()
    imports = import_problems(set(missing))
    problems += ([f"not installed: {', '.join(missing)}"] if missing else []) + out_of_range + imports
    if not (missing or out_of_range or imports):
        problems += device_problems(args.device)
    if problems:
        hint = " (carry them as wheels: scripts/gpu_session.sh prepare)" if missing or out_of_range or imports else ""
        print(f"preflight: the GPU session cannot run: {'; '.join(problems)}{hint}", flush=True)
        return 2
    print(f"preflight: ok: {summary(args.device)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
