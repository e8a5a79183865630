"""Benchmark datasets normalized to ``Record``: conf/dataset/<name>.yaml says what each one is,
``rstitch.data.datasets`` reads it, ``rstitch.data.normalizers`` turns its rows into records."""
from rstitch.data.datasets import DATASETS, DatasetSpec, Record, get_dataset_spec, load_dataset_records

__all__ = ["DATASETS", "DatasetSpec", "Record", "get_dataset_spec", "load_dataset_records"]
