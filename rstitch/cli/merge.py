"""`rstitch-merge`: combine the shard runs of one configuration into one run.

The n shards (`dataset.shard=i dataset.num_shards=n`, each its own run directory) must together hold every
(problem, sample) of the selection once; the merge is written where an unsharded run of that configuration
goes, so that speedups, tables and a later unsharded run (which resumes there) all see one run."""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstitch.configs import override_key
from rstitch.data import load_dataset_records
from rstitch.errors import ConfigError, exit_on_config_error
from rstitch.results.baseline import missing_baseline_note
from rstitch.results.keys import is_sharded, key_differences, run_key, run_tag, unsharded
from rstitch.results.measurement import contention_notes, summarize_measurement
from rstitch.results.metrics import baseline_method
from rstitch.results.store import RUN_KEY_FILE, SAMPLES_FILE, SUMMARY_FILE, SampleStore, iter_samples, sample_key, write_samples
from rstitch.results.summary import format_table, summarize_run

MERGED_FROM_FILE = "merged_from.json"  # marks a run directory written by a merge (a re-merge may replace it)


@dataclass
class Shard:
    dir: Path
    key: dict[str, Any]      # run_key.json
    config: dict[str, Any]   # the resolved config of summary.json
    index: int               # dataset.shard
    count: int               # dataset.num_shards


@dataclass
class MergePlan:
    shards: list[Shard]
    config: dict[str, Any]           # the unsharded configuration
    samples: list[dict[str, Any]]    # in dataset order, as an unsharded run writes them
    target: Path


def read_shard(run_dir: str | Path) -> Shard:
    run_dir = Path(run_dir)
    key_file = run_dir / RUN_KEY_FILE
    if not key_file.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no {RUN_KEY_FILE})")
    key = json.loads(key_file.read_text())
    if not is_sharded(key.get("dataset", {})):
        raise ConfigError(f"{run_dir} is not a shard run (its dataset.num_shards is 1)")
    summary_file = run_dir / SUMMARY_FILE
    if not summary_file.is_file():
        raise ConfigError(f"{run_dir}: shard {key['dataset']['shard']} of {key['dataset']['num_shards']} has not "
                          f"finished (no {SUMMARY_FILE}); rerun it, it resumes")
    config = json.loads(summary_file.read_text()).get("config")
    if not isinstance(config, dict):
        raise ConfigError(f"{run_dir}/{SUMMARY_FILE} has no resolved config; rerun the shard to rewrite it")
    return Shard(run_dir, key, config, key["dataset"]["shard"], key["dataset"]["num_shards"])


def _without_shard_index(key: dict[str, Any]) -> dict[str, Any]:
    return {**key, "dataset": {k: v for k, v in key["dataset"].items() if k != "shard"}}


def check_one_configuration(shards: list[Shard]) -> None:
    """The same run key apart from `dataset.shard`; each of the n shards exactly once."""
    first = shards[0]
    for shard in shards[1:]:
        changed = key_differences(_without_shard_index(first.key), _without_shard_index(shard.key))
        if changed:
            raise ConfigError(f"{shard.dir} and {first.dir} are not shards of one configuration "
                              f"(differ in: {', '.join(changed)})")
    by_index: dict[int, list[Path]] = defaultdict(list)
    for shard in shards:
        by_index[shard.index].append(shard.dir)
    for index, dirs in sorted(by_index.items()):
        if len(dirs) > 1:
            raise ConfigError(f"shard {index} of {first.count} given twice: {', '.join(map(str, dirs))}")
    missing = [i for i in range(first.count) if i not in by_index]
    if missing:
        raise ConfigError(f"missing shard(s) {', '.join(map(str, missing))} of {first.count} "
                          f"(next to {first.dir}); run them with dataset.shard=... before merging")


def merged_samples(shards: list[Shard], config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (problem, sample) of the unsharded selection, each from exactly one shard."""
    found: dict[tuple[str, int], Path] = {}
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for shard in shards:
        path = shard.dir / SAMPLES_FILE
        for sample in iter_samples(path) if path.exists() else ():
            key = sample_key(sample)
            if key in found:
                raise ConfigError(f"sample {key[0]!r} #{key[1]} is recorded twice: in {found[key]} and {shard.dir}")
            found[key], rows[key] = shard.dir, sample
    records = load_dataset_records(**config["dataset"])
    count = shards[0].count
    expected = [(r.id, k) for r in records for k in range(config["n_samples"])]
    missing = [(i // config["n_samples"], key) for i, key in enumerate(expected) if key not in rows]
    if missing:
        index, (problem, k) = missing[0]
        raise ConfigError(f"{len(missing)} of {len(expected)} samples are missing from the shards, first {problem!r} "
                          f"#{k} of shard {index % count}; rerun that shard, it resumes")
    extra = sorted(set(rows) - set(expected))
    if extra:
        raise ConfigError(f"{len(extra)} samples are not in the dataset selection, first {extra[0][0]!r} in "
                          f"{found[extra[0]]}")
    return [rows[key] for key in expected]


def plan_merge(shards: list[Shard]) -> MergePlan:
    """Everything a merge writes, checked before anything is written."""
    check_one_configuration(shards)
    shards = sorted(shards, key=lambda s: s.index)
    config = {**shards[0].config, "dataset": unsharded(shards[0].config["dataset"])}
    target = shards[0].dir.parent / run_tag(config)
    if (target / SAMPLES_FILE).exists() and not (target / MERGED_FROM_FILE).exists():
        raise ConfigError(f"{target} already holds an unsharded run of this configuration; remove it to merge the shards")
    return MergePlan(shards, config, merged_samples(shards, config), target)


def write_merge(plan: MergePlan) -> dict[str, Any]:
    from rstitch.methods import build_method  # lazy: the method registry imports the engines

    method = build_method(**plan.config["method"])
    with SampleStore(plan.target, run_key(plan.config)) as store:  # refuses a directory of another configuration
        names = [s.dir.name for s in plan.shards]
        (plan.target / MERGED_FROM_FILE).write_text(json.dumps({"shards": names}, indent=1))
        write_samples(plan.target, plan.samples)
        # The comparison root is <results_root>/<pair>/<dataset>, as for a run of rstitch-run.
        summary = summarize_run(plan.config, method, plan.samples, plan.target.parent.parent)
        summary["merged_from"] = names
        summary.update(summarize_measurement(plan.samples))  # the shards' conditions, flagged as a run's
        store.write_summary(summary)
    return summary


def find_shard_groups(roots: Sequence[str | Path]) -> list[list[Shard]]:
    """The shard runs under `roots`, grouped by configuration (run key without the shard index)."""
    groups: dict[tuple[Path, str], list[Shard]] = defaultdict(list)
    for root in map(Path, roots):
        if not root.is_dir():
            raise ConfigError(f"no such results directory: {root}")
        for key_file in sorted(root.rglob(RUN_KEY_FILE)):
            if is_sharded(json.loads(key_file.read_text()).get("dataset", {})):
                shard = read_shard(key_file.parent)
                groups[(key_file.parent.parent, json.dumps(_without_shard_index(shard.key), sort_keys=True))].append(shard)
    if not groups:
        raise ConfigError(f"no shard runs under {', '.join(map(str, roots))}")
    return list(groups.values())


def merge(groups: list[list[Shard]]) -> list[tuple[MergePlan, dict[str, Any]]]:
    """Check every group, then write them, the LLM-only baseline first so that the others find it for speedups."""
    plans = sorted((plan_merge(g) for g in groups), key=lambda p: (p.config["method"]["name"] != baseline_method(), str(p.target)))
    return [(plan, write_merge(plan)) for plan in plans]


def shard_overrides(shard: Shard) -> list[str]:
    """The overrides the shard ran with (Hydra's record, if any) less the shard selection: the unsharded run's."""
    record = shard.dir / ".hydra" / "overrides.yaml"
    if not record.is_file():
        return []
    import yaml  # Hydra's own dependency

    overrides = yaml.safe_load(record.read_text()) or []
    return [o for o in overrides if override_key(o) not in ("dataset.shard", "dataset.num_shards")]


@exit_on_config_error("rstitch-merge")
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rstitch-merge", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="the shard run directories of one configuration (with --all: results roots)")
    parser.add_argument("--all", action="store_true", help="merge every sharded configuration found under the paths")
    args = parser.parse_args(argv)
    merged = merge(find_shard_groups(args.paths) if args.all else [[read_shard(p) for p in args.paths]])
    for plan, summary in merged:
        print(format_table(summary))
        for line in contention_notes([summary]):
            print(line)
        # Why the merged run has no speedup, and the command that makes its baseline, as rstitch-run says.
        note = missing_baseline_note(summary, shard_overrides(plan.shards[0]))
        if note:
            print(note)
        print(f"merged {len(plan.shards)} shards, {len(plan.samples)} samples: {plan.target}")


if __name__ == "__main__":
    main()
