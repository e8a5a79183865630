"""Packaged models (engines/packaged.py) on fake chunk packages: assembly in part order, the
checksum, one-line errors for a missing package or a bad checksum, and concurrent first uses."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rstitch.engines import packaged
from rstitch.errors import ConfigError

PAYLOAD = [b"GGUF-part-one|" * 1000, b"part-two|" * 777, b"three"]


def make_parts(root: Path, prefix: str = "fake-model-part", payload: list[bytes] = PAYLOAD) -> None:
    """Installed data-only packages as the real ones are laid out: <module>/__init__.py with
    get_part_path() and the chunk at <module>/data/partNN.bin."""
    for number, chunk in enumerate(payload, start=1):
        module = root / f"{prefix.replace('-', '_')}{number}"
        (module / "data").mkdir(parents=True)
        (module / "data" / f"part{number:02d}.bin").write_bytes(chunk)
        (module / "__init__.py").write_text(textwrap.dedent(f"""\
            import os
            def get_part_path():
                return os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "part{number:02d}.bin")
        """))


def fake_model(sha256: str | None = None, parts: int = len(PAYLOAD)) -> packaged.PackagedModel:
    whole = b"".join(PAYLOAD)
    return packaged.PackagedModel("fake", "nobody/fake", "fake-model-part", parts, "1.0", len(whole),
                                  sha256 or hashlib.sha256(whole).hexdigest())


@pytest.fixture
def installed(tmp_path, monkeypatch):
    site = tmp_path / "site"
    make_parts(site)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("RSTITCH_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_assembles_the_parts_in_order_and_checks_the_sum(installed, monkeypatch):
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "fake", fake_model())
    path = packaged.gguf_file("packaged:fake")
    assert path.read_bytes() == b"".join(PAYLOAD)
    assert path.parent == installed / "cache" / "models" / "fake"
    assert [p.name for p in path.parent.iterdir() if p.name != ".lock"] == ["model.gguf"]  # no partial left
    assert packaged.resolve("packaged:fake", "gguf") == str(path)


def test_checksum_mismatch_is_one_line_and_leaves_nothing(installed, monkeypatch):
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "fake", fake_model(sha256="0" * 64))
    with pytest.raises(ConfigError, match=r"sha256 of the assembled parts is [0-9a-f]{64}, expected 0{64}") as err:
        packaged.gguf_file("packaged:fake")
    assert "\n" not in str(err.value)
    assert not (installed / "cache" / "models" / "fake" / "model.gguf").exists()
    assert not list((installed / "cache" / "models" / "fake").glob("*partial*"))


def test_missing_package_names_it(installed, monkeypatch):
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "fake", fake_model(parts=4))  # part 4 is not installed
    with pytest.raises(ConfigError, match=r"needs package 'fake-model-part4==1.0', which is not installed \(pip install"):
        packaged.check("packaged:fake")


def test_unknown_packaged_name_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown packaged model 'nope'; valid: qwen2.5-coder-0.5b-instruct"):
        packaged.check("packaged:nope")


def test_tilde_paths_are_expanded(monkeypatch, tmp_path):
    from rstitch.engines.base import resolve_model_path

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "models" / "x").mkdir(parents=True)
    assert resolve_model_path("~/models/x") == str(tmp_path / "models" / "x")
    assert resolve_model_path("org/model") == "org/model"


@pytest.mark.slow
def test_concurrent_first_uses_build_one_whole_file(installed):
    """Several processes asking for the model at once: each gets the whole, checked file."""
    whole = b"".join(PAYLOAD)
    script = textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(installed / 'site')!r})
        from rstitch.engines import packaged
        packaged.PACKAGED_MODELS["fake"] = packaged.PackagedModel(
            "fake", "nobody/fake", "fake-model-part", 3, "1.0", {len(whole)}, {hashlib.sha256(whole).hexdigest()!r})
        print(open(packaged.gguf_file("packaged:fake"), "rb").read() == {whole!r})
    """)
    env = {"RSTITCH_CACHE": str(installed / "cache"), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env) for _ in range(4)]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outputs == ["True"] * 4
    directory = installed / "cache" / "models" / "fake"
    assert sorted(p.name for p in directory.iterdir()) == [".lock", "model.gguf"]


def test_an_unwritable_cache_is_one_line(installed, monkeypatch):
    blocker = installed / "blocker"
    blocker.write_text("a file where the cache folder should go")
    monkeypatch.setenv("RSTITCH_CACHE", str(blocker / "cache"))
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "fake", fake_model())
    with pytest.raises(ConfigError, match=r"cannot write the model cache .*; set RSTITCH_CACHE") as err:
        packaged.gguf_file("packaged:fake")
    assert "\n" not in str(err.value)
