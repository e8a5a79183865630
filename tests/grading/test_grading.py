"""Answer extraction, equivalence, the hard timeout, and the gold-solution check."""
from __future__ import annotations

import os
import threading
import time

import pytest

from rstitch.grading import extract_answer, grade, is_equivalent, last_boxed, normalize_answer, quick_compare, verify
from rstitch.grading.extract import Extracted, extract_final
from rstitch.grading.version import GRADER_VERSION, graded_by_older_grader, summary_grader_version

from conftest import SHARED_BENCHMARKS, benchmark_file

# An answer sympy cannot compare quickly: it starts computing ten million factorial.
PATHOLOGICAL = "\\boxed{(10^{7})!}"


# --------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("first \\boxed{1} then \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("nested \\boxed{\\left(3, \\frac{\\pi}{2}\\right)}", "\\left(3, \\frac{\\pi}{2}\\right)"),
        ("set \\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("so it is \\boxed 5.", "5"),
        ("\\fbox{12}", "12"),
        ("$\\framebox{204}$ minutes", "204"),
        ("a cut-off box \\boxed{3} then \\boxed{4", "3"),
        ("\\boxed{} is empty, \\boxed{7} is not", "7"),
        ("The final answer is $\\frac{3}{4}$. I hope it is correct.", "\\frac{3}{4}"),
        ("Final Answer: The final answer is 42. I hope it is correct.", "42"),
        ("**Answer:** 1,000 apples", "1,000"),
        ("The answer is 18 dollars.", "18"),
        ("To answer this, add 3 + 4 = 7, so 12 in total", "12"),
        ("we get x = 3/4", "3/4"),
        ("<think>maybe \\boxed{3}</think>\n\nThe answer is 5.", "5"),
        ("<think>only here \\boxed{3}</think>", "3"),
        ("no number at all", None),
        ("", None),
    ],
)
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("So \\boxed{B}", "B"),
        ("\\boxed{\\text{(C)}}", "C"),
        ("\\boxed{D) 42 J}", "D"),
        ("The answer is (B).", "B"),
        ("Answer: C", "C"),
        ("The answer is A bit subtle... Answer: D) 42", "D"),
        ("A) x\nB) y\nC) z\nD) w\nThe correct option is **C**.", "C"),
        ("Thinking it over.\n\n(D)", "D"),
        ("Thinking it over.\n\nB) because of symmetry", "B"),
        ("A) x\nB) y", "B"),
        ("no letter here", None),
        ("\\boxed{42}", None),
    ],
)
def test_extract_multiple_choice_letter(response, expected):
    assert extract_answer(response, multiple_choice=True) == expected


@pytest.mark.parametrize(
    "response",
    [
        "answer" + " " * 100_000 + "x",  # many optional \\s* in a row must not backtrack
        "\\boxed{" * 20_000,  # unclosed boxes must not be rescanned
        ("The answer is " + " " * 50) * 2_000,
    ],
)
def test_extraction_stays_fast_on_adversarial_text(response):
    start = time.process_time()  # CPU time: the work done, whatever else the machine runs
    for multiple_choice in (False, True):
        extract_answer(response, multiple_choice=multiple_choice)
    assert time.process_time() - start < 2.0


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        # one answer written in several boxes
        ("$$\\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}$$", "(2, 2), (6, 2)"),
        ("\\boxed{1},\\boxed{2},\\boxed{3}", "1, 2, 3"),
        ("\\boxed{k = 45} \\text{ and } \\boxed{n = 2}", "k = 45, n = 2"),
        ("$$\\boxed{(3, 3)} \\text{ for part (a) and } \\boxed{(1, 1)}$$", "(3, 3), (1, 1)"),
        ("\\boxed{5} and \\boxed{5}", "5"),  # a repeated box is no second part
        # boxes that are drafts, not parts
        ("first \\boxed{3}. On reflection the count is \\boxed{4}.", "4"),
        ("\\boxed{3}\n\n**Final Answer**\n\\boxed{5}", "5"),
        ("\\boxed{1} no no no no no \\boxed{2}", "2"),
        # a final-answer statement after the last box wins over it
        ("so the interest is $\\boxed{255}$. In total $10,455$. Final Answer: The final answer is $10,455$.", "10,455"),
        ("The step is \\boxed{12}. Final answer: the area is 96.", "96"),
        ("\\boxed{7}. The final answer should be checked once more.", "7"),  # states no value
        # a final-answer sentence yields the value it states
        ("Final Answer: The largest $n$ is 34.", "34"),
        ("Final Answer: The volume of $ABCDEFGH$ is 120. I hope it is correct.", "120"),
        ("The answer is $x = 5$.", "x = 5"),
        # no box: the last LaTeX span, unless a bare number follows it
        ("Therefore $x \\geq 5$ is the solution.", "x \\geq 5"),
        ("The identity matrix is $\\begin{pmatrix}1 & 0 \\\\ 0 & 1\\end{pmatrix}$.", "\\begin{pmatrix}1 & 0 \\\\ 0 & 1\\end{pmatrix}"),
        ("We have $x = 2$, so there are 12 apples.", "12"),
        ("Adding, $3 + 4 = 7 = y$.", "y"),  # a chain of equalities gives its last side
        ("He paid $20 and got $5 back.", "5"),  # currency signs, not a span
        ("\\frac{10}{9}", "\\frac{10}{9}"),  # a response that is one undelimited expression
        ("so the chance is \\frac{2}{3} in the end", "\\frac{2}{3}"),
        ("The code reads QXRT7B.", None),  # a digit inside a name is no number
        ("That is 1 000 in all.", "1 000"),
        ("Total: 2,74 per unit", "2,74"),  # a decimal comma standing alone is one number
        ("the numbers 1,2,3", "3"),
    ],
)
def test_extract_the_answer_meant(response, expected):
    assert extract_answer(response) == expected


def test_extract_final_keeps_the_parts_of_several_boxes():
    found = extract_final("\\boxed{1} and \\boxed{2}")
    assert found == Extracted("1, 2", ("1", "2"))
    assert verify.shaped_like_gold(found, "(1, 2)") == "(1, 2)"
    assert verify.shaped_like_gold(found, "\\{1,2\\}") == "\\{1, 2\\}"
    assert verify.shaped_like_gold(found, "(1, 2), (3, 4)") == "1, 2"  # two tuples: not one bracket
    assert verify.shaped_like_gold(found, "(1, 2, 3)") == "1, 2"  # a part missing stays visible


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("A. Because B is not valid", "A"),  # the answer opens with its letter
        ("(C) since the other three contradict the data", "C"),
        ("Because B is valid", None),  # a letter in prose is no choice
        ("I would go with D", None),
        ("A) 2\nB) 3\nC) 4\nD) 5\nLet me think about it.", None),  # restating the options is no answer
    ],
)
def test_letters_without_an_anchor(response, expected):
    assert extract_answer(response, multiple_choice=True) == expected


def test_last_boxed_skips_escaped_braces():
    assert last_boxed("\\boxed{\\}}") == "\\}"
    assert last_boxed("nothing") is None


# --------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize(
    ("predicted", "gold", "expected"),
    [
        ("27.0", "27", True),
        ("1,000", "1000", True),
        ("025", "25", True),
        ("\\$18.00", "18", True),
        ("19", "18", False),
        ("\\dfrac{14}{3}", "\\frac{14}{3}", True),
        ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
        ("\\text{Evelyn}", "\\text{Evelyn}", True),
        ("90", "90^\\circ", True),
        ("50\\%", "50", True),
        ("4.5\\times 10^{33}", "4.5e33", True),
        ("\\textbf{(073)}", "073", True),
        ("10080", "10,\\!080", True),
        ("11111111100", "11,\\! 111,\\! 111,\\! 100", True),
        ("\\$32,348", "\\$32,\\!348", True),
    ],
)
def test_quick_compare_settles_plain_cases(predicted, gold, expected):
    assert quick_compare(predicted, gold) is expected


def test_quick_compare_defers_what_needs_math_verify():
    assert quick_compare("14/3", "\\frac{14}{3}") is None
    assert quick_compare("0.3333333", "0.333333") is None  # decimals: math-verify's rounding decides
    assert quick_compare("2125", "2, 125") is None  # a list, not a number with a thousands separator


def test_normalize_answer():
    assert normalize_answer("$\\left( 1, 2 \\right).$") == "(1,2)"
    assert normalize_answer("\\text{ 12,345 }") == "12345"


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        ("\\boxed{14/3}", "\\frac{14}{3}", True),
        ("\\boxed{4.6667}", "\\frac{14}{3}", False),
        ("\\boxed{[1, 2)}", "[1,2)", True),
        ("\\boxed{(1, 2)}", "[1,2)", False),
        ("\\boxed{\\{2, 1\\}}", "\\{1,2\\}", True),
        ("\\boxed{-2, 1}", "1,-2", True),
        ("\\boxed{1, 2}", "1,-2", False),
        ("\\boxed{Bob}", "\\text{Evelyn}", False),
        ("\\boxed{5}", "x=5", True),
        ("\\boxed{-q+p}", "p - q", True),
        ("\\boxed{q - p}", "p - q", False),
        ("\\boxed{\\sqrt{117}}", "3\\sqrt{13}", True),
        ("\\boxed{1.6 \\text{ cm}}", "1.6", True),
        ("\\boxed{0.5}", "\\frac{1}{2}", True),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
        ("The final answer is $\\frac{3}{4}$.", "0.75", True),
        ("The final answer is 1,250.", "1250", True),
        ("\\boxed{27}", "27.0", True),
        ("\\boxed{2125}", "2, 125", False),
        ("\\boxed{864}", "864 \\mbox{ inches}^2", True),
        ("\\boxed{[-2,7]}", "x \\in [-2,7]", True),
        ("no answer", "5", False),
    ],
)
def test_grade(response, gold, expected):
    assert grade(response, gold) is expected


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        # several boxes against the gold's structure
        ("$$\\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}$$", "(2, 2), (6, 2)", True),
        ("\\boxed{1},\\boxed{2},\\boxed{3}", "\\{1,2,3\\}", True),
        ("\\boxed{k = 45} \\text{ and } \\boxed{n = 2}", "k = 45, n = 2", True),
        ("\\boxed{2} \\text{ and } \\boxed{5}", "(2, 5)", True),
        ("\\boxed{5} \\text{ and } \\boxed{2}", "(2, 5)", False),  # a tuple keeps its order
        ("\\boxed{1} and \\boxed{2}", "1, 2, 3", False),
        # final-answer statements
        ("Final Answer: The largest $n$ is 34.", "34", True),
        ("$0.05 \\cdot 10,200 \\cdot \\frac{1}{2} = \\boxed{255}$. Final Answer: The final answer is $10,455$.", "10455", True),
        # percent and unit words
        ("\\boxed{28 percent}", "28\\%", True),
        ("\\boxed{28 pct}", "28\\%", True),
        ("\\boxed{28 percentage}", "28\\%", True),
        ("\\boxed{28 \\text{ percent}}", "28\\%", True),
        ("\\boxed{29 percent}", "28\\%", False),
        ("\\boxed{15 cm^2}", "15", True),
        ("\\boxed{125 miles}", "125\\text{ miles}", True),
        ("\\boxed{\\frac{1}{3} meters}", "\\frac{1}{3}", True),
        ("\\boxed{2 pi}", "2", False),  # math in words is no unit
        # LaTeX spans in prose
        ("Therefore $x \\geq 5$ is the solution.", "x \\ge 5", True),
        ("Therefore $x \\geq 5$ is the solution.", "5", False),
        ("The identity matrix is $\\begin{pmatrix}1 & 0 \\\\ 0 & 1\\end{pmatrix}$.", "\\begin{pmatrix}1 & 0 \\\\ 0 & 1\\end{pmatrix}", True),
        # math-verify's parse drops 1/\\mathrm{e}: we pass e
        ("$1 + \\frac{1}{\\mathrm{e}}$", "1 - \\frac{1}{\\mathrm{e}}", False),
        ("$1 - \\frac{1}{e}$", "1 - \\frac{1}{\\mathrm{e}}", True),
    ],
)
def test_grade_reads_the_answer_meant(response, gold, expected):
    assert grade(response, gold) is expected


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        # decimal commas: read as a decimal point against one number, as a list against a list
        ("\\boxed{1,22}", "1.22", True),
        ("\\boxed{1.22}", "1,22", True),
        ("\\boxed{0.111}", "0,111", True),  # "0,111" is no thousands grouping
        ("\\boxed{1,22}", "1, 22", True),
        ("\\boxed{1.22}", "1, 22", False),
        ("\\boxed{1,220}", "1.22", False),  # three digits after the comma: thousands
        ("\\boxed{1,220}", "1220", True),
        # comma lists: a bare list is a set of answers, a bracketed tuple is ordered
        ("\\boxed{4, 10, -2}", "10, 4, -2", True),
        ("\\boxed{4, 12, 2}", "10, 4, 2", False),
        ("\\boxed{(4, 10, -2)}", "(10, 4, -2)", False),
        ("\\boxed{(10, 4, -2)}", "(10, 4, -2)", True),
    ],
)
def test_policy_cases(response, gold, expected):
    assert grade(response, gold) is expected


def test_letter_policy_both_ways():
    assert grade("A. Because B is not valid", "A", multiple_choice=True)
    assert not grade("A. Because B is not valid", "B", multiple_choice=True)
    assert not grade("Because B is valid", "B", multiple_choice=True)


def test_percent_and_unit_words_normalize_like_text_percent():
    for written in ("28 percent", "28 pct", "28 percentage", "28 \\text{ percent}", "28\\%", "28 \\text{pct}"):
        assert normalize_answer(written) == "28", written
    assert normalize_answer("15 cm^2") == normalize_answer("15\\mbox{ cm}^2") == "15"
    assert normalize_answer("2 pi") != "2"


def test_grader_version_of_a_summary():
    assert summary_grader_version({}) == 1  # summaries from before versions were recorded
    assert summary_grader_version({"grader_version": GRADER_VERSION}) == GRADER_VERSION
    assert graded_by_older_grader({}) and not graded_by_older_grader({"grader_version": GRADER_VERSION})


@pytest.mark.parametrize(
    "response, gold, tolerance, expected",
    [
        ("\\boxed{4.16}", "4.2", [0.1], True),      # OlympiadBench record 2592: gold 4.2, error 0.1
        ("\\boxed{4.16}", "4.2", None, False),      # without the tolerance it is wrong
        ("\\boxed{4.35}", "4.2", [0.1], False),     # 0.15 away
        ("\\boxed{4.301}", "4.2", [0.1], True),     # the judge's 1% slack: 0.101
        ("\\boxed{1.02, 2.9}", "1, 3", [0.05, 0.2], True),
        ("\\boxed{2.9, 1.02}", "1, 3", [0.05, 0.2], True),   # parts pair up in any order
        ("\\boxed{1.02, 2.9}", "1, 3", [0.05, None], False),  # an empty entry: that part is exact
        ("\\boxed{1.02}", "1, 3", [0.05], False),   # a part missing
        ("\\boxed{\\frac{21}{5}}", "4.2", [0.1], True),  # equivalent forms still count
        ("\\boxed{x}", "4.2", [0.1], False),
    ],
)
def test_grade_honours_a_tolerance(response, gold, tolerance, expected):
    assert grade(response, gold, tolerance=tolerance) is expected


def test_grade_sample_reads_the_tolerance_of_a_record():
    metadata = {"tolerance": [0.1], "answer_type": None}
    assert verify.grade_sample("so \\boxed{4.16}", "4.2", metadata=metadata)["correct"] is True
    assert verify.grade_sample("so \\boxed{4.16}", "4.2", metadata={})["correct"] is False


def test_split_parts_keeps_commas_inside_brackets_and_numbers():
    assert verify.split_parts("(1, 2), [3,4], \\{5,6\\}") == ["(1, 2)", "[3,4]", "\\{5,6\\}"]
    assert verify.split_parts("1,000") == ["1,000"]
    assert verify.split_parts("$2, 3$") == ["2", "3"]


def test_grade_multiple_choice():
    assert grade("Therefore the answer is (C).", "C", multiple_choice=True)
    assert grade("\\boxed{c}", "C", multiple_choice=True) is False  # lower case is not an option label
    assert grade("\\boxed{B}", "C", multiple_choice=True) is False
    assert grade("I cannot decide.", "C", multiple_choice=True) is False


def test_grade_rejects_a_non_positive_timeout():
    with pytest.raises(ValueError):
        grade("\\boxed{14/3}", "\\frac{14}{3}", timeout_s=0)


# --------------------------------------------------------------------------- hard timeout


# A time limit is wall clock by design, so the timeout tests check that it fired (the pool's count
# of timed-out comparisons) and that the caller waited at least the limit; an upper bound in wall
# seconds is only a guard against a hang, far above what any load stretches a 1 s limit to.
HANG_GUARD_S = 120.0


def _timed_pathological_grade(timeout_s: float) -> tuple[bool, float]:
    start = time.monotonic()
    result = grade(PATHOLOGICAL, "5", timeout_s=timeout_s)
    return result, time.monotonic() - start


def _warm_worker() -> None:
    # Leave an idle worker so the timed call measures the comparison, not interpreter startup.
    assert is_equivalent("7/3", "\\frac{14}{6}")


def test_timeout_from_the_main_thread_returns_false_and_replaces_the_worker():
    _warm_worker()
    replaced = verify._get_pool().timed_out
    result, elapsed = _timed_pathological_grade(timeout_s=1.0)
    assert result is False
    assert 1.0 <= elapsed < HANG_GUARD_S
    assert verify._get_pool().timed_out == replaced + 1  # the time limit did fire
    assert grade("\\boxed{7/3}", "\\frac{14}{6}")  # a fresh worker takes over


def test_timeout_from_another_thread():
    _warm_worker()
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"], outcome["elapsed"] = _timed_pathological_grade(timeout_s=1.0)
        except BaseException as err:  # noqa: BLE001 - surfaced by the assertion below
            outcome["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=HANG_GUARD_S)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"] is False
    assert 1.0 <= outcome["elapsed"] < HANG_GUARD_S  # type: ignore[operator]


def test_threads_grade_concurrently():
    results: list[bool] = []
    lock = threading.Lock()

    def run(k: int) -> None:
        verdict = grade(f"\\boxed{{{k}/2}}", f"\\frac{{{k}}}{{2}}")
        with lock:
            results.append(verdict)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [True] * 6


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_forked_child_uses_its_own_workers():
    _warm_worker()
    pid = os.fork()
    if pid == 0:  # child: must not talk to the parent's workers through inherited pipes
        ok = is_equivalent("7/3", "\\frac{14}{6}") and is_equivalent("1/2", "0.5")
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert is_equivalent("5/3", "\\frac{10}{6}")


# --------------------------------------------------------------------------- gold solutions


def test_gold_solutions_grade_as_right():
    from rstitch.data.export import export_file_name
    from rstitch.data.gold_check import CASES, check_all, report

    for name in CASES:
        benchmark_file(export_file_name(name))
    results = {r.dataset: r for r in check_all(SHARED_BENCHMARKS)}
    assert {name: r.total for name, r in results.items()} == {
        "math500": 500, "gsm8k": 1319, "minerva": 272, "aime24": 30, "amc23": 40,
    }
    for result in results.values():
        assert result.fraction_right >= 0.99, report([result])


# --------------------------------------------------------------------------- hostile input

HOSTILE_TIMEOUT_S = 1.0
MB = 1 << 20

# Each pair is (response, gold); every one returns a bool within the timeout, none raises.
HOSTILE = {
    "huge exponent e": ("\\boxed{1e1000000000}", "5"),
    "huge negative exponent": ("\\boxed{1e-1000000000}", "5"),
    "huge exponent times ten": ("\\boxed{1\\times10^{1000000000}}", "5"),
    "huge exponent 1e100000000": ("\\boxed{1e100000000}", "5"),
    "huge power of ten": ("\\boxed{10^{1000000000}}", "5"),
    "exponent past Decimal's range": ("\\boxed{1e" + "9" * 40 + "}", "5"),
    "tower": ("\\boxed{2^{2^{2^{2^{2^{2^{2}}}}}}}", "5"),
    "factorial": ("\\boxed{(10^{7})!}", "5"),
    "deep optional arguments": ("\\boxed" + "[]" * 2000 + "{1}", "1"),
    "repeated unclosed box[": ("\\boxed[" * (MB // 7), "1"),
    "repeated box[] chain": ("\\boxed[\\boxed[" * 1000 + "]" + "[]" * 100_000, "1"),
    "deep braces": ("\\boxed{" + "{" * 100_000 + "1" + "}" * 100_000 + "}", "1"),
    "deep unclosed braces": ("\\boxed{" * (MB // 7), "1"),
    "1 MB of digits": ("9" * MB, "9"),
    "digits then junk": ("1" * MB + "x", "1"),
    "gold of 5000 digits": ("\\boxed{5}", "1" * 5000),
    "gold of 1 MB": ("\\boxed{5}", "1" * MB),
    "scientific gold of 4400 digits": ("\\boxed{5}", "1" * 4400 + "e5"),
    "answer statements": ("The answer is " * (MB // 14), "1"),
    "code-like": ("\\boxed{__import__('os').system('echo pwned')}", "0"),
    "lambda": ("\\boxed{(lambda: 1)()}", "1"),
    "newlines and spaces": (" \n" * (MB // 2) + "\\boxed{3}", "3"),
    "think tags": ("</think>" * (MB // 8), "1"),
}


@pytest.mark.parametrize("response,gold", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_input_grades_in_time_without_raising(response, gold):
    _warm_worker()
    pool = verify._get_pool()
    timed_out, start = pool.timed_out, time.process_time()
    for multiple_choice in (False, True):
        assert isinstance(extract_answer(response, multiple_choice=multiple_choice), (str, type(None)))
        assert isinstance(grade(response, gold, multiple_choice=multiple_choice, timeout_s=HOSTILE_TIMEOUT_S), bool)
    # The work done here, in CPU time (a busy machine stretches the wall clock, not this): extracting a
    # megabyte in pure Python, four times, took at most 1.0 CPU-second here; grading it in this process
    # instead of the time-limited worker would take minutes. The worker's comparisons are cut by the
    # limit: at most one per grade ran out of time.
    assert time.process_time() - start < 5.0
    assert pool.timed_out - timed_out <= 2


def test_huge_exponents_are_settled_without_math_verify():
    for notation in ("1e1000000000", "1e-1000000000", "1\\times10^{1000000000}", "1e100000000"):
        assert quick_compare(notation, "5") is False
    assert quick_compare("1e1000000000", "10e999999999") is True


def test_deep_box_options_do_not_recurse():
    assert last_boxed("\\framebox[1cm][c]{7}") == "7"
    assert last_boxed("\\boxed" + "[]" * 2000 + "{1}") is None  # no box takes 2000 options
    assert extract_answer("\\framebox[1cm] 5") == "5"


def test_grading_random_latex_like_text_returns_a_bool_in_time():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    pieces = ["\\boxed{", "\\boxed[", "\\framebox", "\\frac", "{", "}", "[", "]", "^", "_", "!", "(", ")", "1", "0",
              "e", "9" * 30, "\\times10^{", "\\sqrt", "\\cdot", " ", "\n", "$", "\\", "answer is ", "-", ".", ",",
              "\\text{", "</think>", "x", "\\pi", "\\infty", "=", "A", "(B)"]
    text = st.lists(st.sampled_from(pieces), max_size=60).map("".join)

    @settings(max_examples=40, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(response=text, gold=text, multiple_choice=st.booleans())
    def check(response, gold, multiple_choice):
        start = time.process_time()  # this process's work; the worker's is cut by its time limit
        verdict = grade(response, gold, multiple_choice=multiple_choice, timeout_s=HOSTILE_TIMEOUT_S)
        assert isinstance(verdict, bool)
        assert time.process_time() - start < 1.0

    check()


def test_timeout_does_not_stretch_with_more_callers_than_workers(monkeypatch):
    """A comparison's time limit starts when a worker starts it: an answer queued behind two hanging
    ones on a one-worker pool still gets its whole limit and is graded right, not cut as a timeout."""
    pool = verify._VerifyPool(workers=1)
    assert pool.compare("1", "1", timeout_s=60.0)  # the worker started: time only the comparisons
    monkeypatch.setattr(verify, "_POOL", pool)
    spans: list[tuple[float, float]] = []
    queued: dict[str, bool] = {}

    def hang() -> None:
        start = time.monotonic()
        result, seconds = _timed_pathological_grade(timeout_s=HOSTILE_TIMEOUT_S)
        assert result is False
        spans.append((start, start + seconds))

    def fair() -> None:
        queued["equal"] = is_equivalent("7/3", "\\frac{14}{6}", timeout_s=HOSTILE_TIMEOUT_S, fast_path=False)

    threads = [threading.Thread(target=hang), threading.Thread(target=hang), threading.Thread(target=fair)]
    for thread in threads:
        thread.start()
        time.sleep(0.2)  # in this order into the pool's queue
    for thread in threads:
        thread.join(timeout=120)
    pool.close()
    assert len(spans) == 2 and pool.timed_out == 2  # each hanging comparison was killed at its own limit
    assert all(end - start >= HOSTILE_TIMEOUT_S for start, end in spans)
    assert queued == {"equal": True}  # waited behind both, then compared in full
