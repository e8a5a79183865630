"""Answer extraction and equivalence checking for model responses."""
from rstitch.grading.extract import extract_answer, last_boxed
from rstitch.grading.verify import grade, grade_sample, is_equivalent, normalize_answer, quick_compare

__all__ = ["extract_answer", "grade", "grade_sample", "is_equivalent", "last_boxed", "normalize_answer", "quick_compare"]
