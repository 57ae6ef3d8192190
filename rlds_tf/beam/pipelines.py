"""The pipelines behind `rlds-tf convert --runner/--num-workers` and `rlds-tf stats --runner`."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional, Sequence

import apache_beam as beam
import tensorflow as tf
from apache_beam.options.pipeline_options import PipelineOptions

from rlds_tf import step_statistics
from rlds_tf.beam.reading import ReadEpisodes
from rlds_tf.beam.statistics import DatasetStatistics
from rlds_tf.beam.writing import WriteEpisodes


def pipeline_options(runner: Optional[str], num_workers: Optional[int],
                     beam_args: Sequence[str] = ()) -> PipelineOptions:
    """Beam options from the CLI's `--runner`/`--num-workers` and the further options, passed unchanged.

    On the DirectRunner `num_workers` is `direct_num_workers` in `multi_processing` mode (one process per
    worker); on other runners it is `--num_workers` (Dataflow's name; Flink and Spark take their own options,
    e.g. `--parallelism`, passed through as given).
    """
    args = list(beam_args)
    runner = runner or "DirectRunner"
    args.append(f"--runner={runner}")
    if num_workers is not None:
        if runner in ("DirectRunner", "direct"):
            args += [f"--direct_num_workers={num_workers}", "--direct_running_mode=multi_processing"]
        else:
            args.append(f"--num_workers={num_workers}")
    return PipelineOptions(args)


def unknown_options(beam_args: Sequence[str]) -> List[str]:
    """The arguments none of Beam's PipelineOptions classes take: Beam would drop them without a word.

    Parsed with the parser `PipelineOptions.get_all_options` builds from every registered options class
    (those of the DirectRunner, Dataflow, Flink, Spark, ... and any the caller imported), so an option for
    any runner passes and a mistyped one (or a stray positional argument) is reported.
    """
    parsers = []
    PipelineOptions([]).get_all_options(add_extra_args_fn=parsers.append)  # (no flags: no warning logged)
    _, unknown = parsers[0].parse_known_args(list(beam_args))
    return list(unknown)


def convert(src: str, dst: str, file_format: str, *, options: PipelineOptions,
            max_episodes_per_file: int = 1000, num_shards: Optional[int] = None,
            report_progress: bool = True) -> Dict[str, int]:
    """`rlds-tf convert` on Beam: the same directory the single-process convert writes; `{split: episodes}`.

    The episode records are copied byte for byte (read raw per shard, checked against the features, written
    in each split's order), as the single-process convert copies them.
    """
    read = ReadEpisodes(src, with_index=True, report_progress=report_progress, raw_records=True)
    if os.path.abspath(os.path.expanduser(src)) == os.path.abspath(os.path.expanduser(dst)):
        raise ValueError(f"DST ({dst!r}) must differ from the source directory")
    write = WriteEpisodes(dst, read.info, num_shards, file_format=file_format, version=str(read.info.version),
                          max_episodes_per_file=max_episodes_per_file, report_progress=report_progress)
    try:
        with beam.Pipeline(options=options) as pipeline:
            _ = pipeline | "ReadEpisodes" >> read | "WriteEpisodes" >> write
    except BaseException:
        shutil.rmtree(write.partial_directory, ignore_errors=True)
        raise
    with open(os.path.join(dst, "dataset_info.json"), encoding="utf-8") as f:
        splits = json.load(f).get("splits", [])
    counts = {s["name"]: sum(int(n) for n in s.get("shardLengths", [])) for s in splits}
    return {name: counts[name] for name in sorted(counts)}  # in the single-process convert's order


def _write_json(summary: Dict[str, Any], path: str) -> None:
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps(summary, allow_nan=False))


def stats(directory: str, *, options: PipelineOptions, split: Optional[str] = None,
          output: Optional[str] = None, report_progress: bool = True) -> Dict[str, Any]:
    """`rlds-tf stats` on Beam: `{split: {'episodes', 'fields': {path: {count, mean, std, min, max}}}}`.

    The figures reach the launcher through a JSON file (`output`, default a local temporary file: give a path
    every worker can write, e.g. gs://..., on a distributed runner).
    """
    read = ReadEpisodes(directory, split, report_progress=report_progress)
    by_split = read.splits
    scratch = None
    if output is None:
        scratch = tempfile.mkdtemp(prefix="rlds-tf-stats-")
        output = os.path.join(scratch, "stats.json")
    try:
        with beam.Pipeline(options=options) as pipeline:
            episodes = pipeline | "ReadEpisodes" >> read
            if split is not None:
                episodes = {split: episodes}
            per_split = [
                episodes[name]
                | f"Statistics[{name}]" >> beam.CombineGlobally(DatasetStatistics(with_num_episodes=True))
                | f"Json[{name}]" >> beam.Map(lambda s, n=name: (n, _plain(s)))
                for name in by_split]
            _ = (per_split | "AllSplits" >> beam.Flatten() | "ToList" >> beam.combiners.ToList()
                 | "Write" >> beam.Map(lambda pairs: _write_json(dict(sorted(pairs)), output)))
        with tf.io.gfile.GFile(output) as f:
            return json.load(f)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _plain(summary: Dict[str, Any]) -> Dict[str, Any]:
    return step_statistics.to_json(summary["episodes"], summary["fields"])
