"""Packaged models (engines/packaged.py) on fake chunk packages: found from their metadata without
importing them, assembly in part order, the checksum before anything reads the file (also a cached
file changed in place), the hub source with only the download call replaced, one-line errors for a
missing package or a bad checksum, and concurrent first uses."""
from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rstitch.engines import packaged
from rstitch.errors import ConfigError

PAYLOAD = [b"GGUF-part-one|" * 1000, b"part-two|" * 777, b"three"]


def make_parts(root: Path, prefix: str = "fake-model-part", payload: list[bytes] = PAYLOAD, version: str = "1.0") -> None:
    """Installed data-only packages as the real ones are laid out (<module>/__init__.py with
    get_part_path(), the chunk at <module>/data/partNN.bin, a dist-info whose RECORD lists them),
    except that importing one writes a file beside it: the code must never run."""
    for number, chunk in enumerate(payload, start=1):
        module_name = f"{prefix.replace('-', '_')}{number}"
        module = root / module_name
        (module / "data").mkdir(parents=True)
        (module / "data" / f"part{number:02d}.bin").write_bytes(chunk)
        (module / "__init__.py").write_text(textwrap.dedent(f"""\
            import os
            open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "IMPORTED"), "w").close()
            def get_part_path():
                return os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "part{number:02d}.bin")
        """))
        info = root / f"{module_name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {prefix}{number}\nVersion: {version}\n")
        files = [f"{module_name}/__init__.py", f"{module_name}/data/part{number:02d}.bin", f"{info.name}/METADATA"]
        (info / "RECORD").write_text("".join(f"{f},,\n" for f in files) + f"{info.name}/RECORD,,\n")


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
    assert sorted(p.name for p in path.parent.iterdir() if p.name != ".lock") == ["model.gguf", "model.gguf.sha256.json"]  # no partial
    assert packaged.resolve("packaged:fake", "gguf") == str(path)
    assert not list((installed / "site").glob("*/IMPORTED"))  # found from the metadata, never imported


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
    assert sorted(p.name for p in directory.iterdir()) == [".lock", "model.gguf", "model.gguf.sha256.json"]


def test_an_unwritable_cache_is_one_line(installed, monkeypatch):
    blocker = installed / "blocker"
    blocker.write_text("a file where the cache folder should go")
    monkeypatch.setenv("RSTITCH_CACHE", str(blocker / "cache"))
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "fake", fake_model())
    with pytest.raises(ConfigError, match=r"cannot write the model cache .*; set RSTITCH_CACHE") as err:
        packaged.gguf_file("packaged:fake")
    assert "\n" not in str(err.value)


def test_a_cached_file_changed_in_place_is_hashed_again_and_rebuilt(installed, monkeypatch):
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "fake", fake_model())
    path = packaged.gguf_file("packaged:fake")
    with open(path, "r+b") as handle:  # same size, other bytes
        handle.write(b"EVIL")
    assert packaged.gguf_file("packaged:fake").read_bytes() == b"".join(PAYLOAD)
    packaged._stamp(path).unlink()  # a cache of the layout before the record: hashed once, kept
    before = path.stat().st_ino
    assert packaged.gguf_file("packaged:fake").stat().st_ino == before and packaged._stamp(path).is_file()


def test_an_installed_package_of_another_version_is_one_line(tmp_path, monkeypatch):
    make_parts(tmp_path / "site", version="0.9")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("RSTITCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "fake", fake_model())
    with pytest.raises(ConfigError, match=r"needs package 'fake-model-part1==1.0', found 0.9"):
        packaged.check("packaged:fake")


HUB = packaged.HubFile("Owner/Fake-GGUF", "fake-q4_k_m.gguf", "0123456789abcdef0123456789abcdef01234567")


def fake_download(payload: bytes, calls: list):
    """Stands in for huggingface_hub.hf_hub_download (no network here): writes `payload` where the
    real call puts the file with local_dir, and records the call."""
    def download(repo_id, filename, *, revision, local_dir):
        calls.append((repo_id, filename, revision))
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        (Path(local_dir) / filename).write_bytes(payload)
        return str(Path(local_dir) / filename)
    return download


def test_the_hub_source_downloads_the_pinned_revision_and_checks_the_sum(tmp_path, monkeypatch):
    import huggingface_hub

    calls: list = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download(b"".join(PAYLOAD), calls))
    monkeypatch.setenv("RSTITCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(packaged.SOURCE_ENV, "hub")
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "fake", dataclasses.replace(fake_model(), hub=HUB))
    packaged.check("packaged:fake")  # no package is needed
    path = packaged.gguf_file("packaged:fake")
    assert path.read_bytes() == b"".join(PAYLOAD) and calls == [(HUB.repo_id, HUB.filename, HUB.revision)]
    assert sorted(p.name for p in path.parent.iterdir() if p.name != ".lock") == ["model.gguf", "model.gguf.sha256.json"]


def test_a_hub_file_with_another_sum_is_refused_and_left_nowhere(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download(b"not the model", []))
    monkeypatch.setenv("RSTITCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(packaged.SOURCE_ENV, "hub")
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "fake", dataclasses.replace(fake_model(), hub=HUB))
    with pytest.raises(ConfigError, match=r"sha256 of Owner/Fake-GGUF@0123456789ab/fake-q4_k_m.gguf is [0-9a-f]{64}, expected"):
        packaged.gguf_file("packaged:fake")
    assert [p.name for p in (tmp_path / "cache" / "models" / "fake").iterdir()] == [".lock"]


def test_the_real_pair_names_its_hub_files_at_pinned_revisions_and_a_bad_source_is_one_line(monkeypatch):
    for model in packaged.PACKAGED_MODELS.values():
        assert model.hub is not None and model.hub.repo_id.startswith("Qwen/") and len(model.hub.revision) == 40
    monkeypatch.setenv(packaged.SOURCE_ENV, "internet")
    with pytest.raises(ConfigError, match=r"RSTITCH_PACKAGED_SOURCE='internet' is not a source; valid: packages, hub"):
        packaged.check("packaged:qwen2.5-coder-0.5b-instruct")
