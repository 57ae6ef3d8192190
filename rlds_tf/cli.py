"""`rlds-tf`: command line for RLDS datasets.

  rlds-tf info DIR_OR_NAME [--split train] [--max-episodes N] [--plot returns.png] [--json]
      episodes and steps per split, the step and episode fields (dtype, shape), statistics of episode
      returns (sum of rewards) and lengths; `--plot` draws both per episode (needs matplotlib).
  rlds-tf convert SRC DST --format array_record|tfrecord [--max-episodes-per-file N]
      copies a dataset into the other on-disk format (same features, splits and episodes, in order; the
      episode records are copied byte for byte, never decoded and re-encoded), re-sharded N episodes a file.
      With --runner and/or --num-workers N, runs as an Apache Beam pipeline (shards read and written in
      parallel; needs `pip install rl-data-tf[beam]`); further options go to Beam's PipelineOptions as given.
  rlds-tf stats DIR [--split S] [--json] [--output PATH] [--runner R] [--num-workers N] [BEAM OPTIONS]
      count, mean, std, min and max of every numeric step field per split, in one process or on Beam.
      On Beam (convert and stats) an option that neither rlds-tf nor any of Beam's PipelineOptions takes is
      an error, and --data-dir is not taken: give the dataset directory.
  rlds-tf recover DIR
      repairs a directory left by a killed rlds_tf recorder (see `rlds_tf.recording.recover`); reading a
      dataset (info, convert, `rlds_tf.load`) never writes into it.

DIR_OR_NAME is a dataset directory (the one holding dataset_info.json, e.g. what `rlds_tf.EnvLogger` wrote)
or a registered TFDS name such as `d4rl_mujoco_hopper/v2-medium` (then `--data-dir` is TFDS's data dir).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from typing import Any, Dict, Optional, Sequence

import numpy as np

_FORMATS = ("tfrecord", "array_record")


def _describe_features(feature) -> Dict[str, str]:
    """`{'observation': 'float32[10, 5]', 'meta/x': ...}` for a TFDS features dict (nested paths joined by /)."""
    import tensorflow as tf  # noqa: PLC0415  (imports TF: after argument parsing)
    import tree  # noqa: PLC0415  (imports TF: after argument parsing)

    signature = feature.get_tensor_info()
    out = {}
    for path, info in tree.flatten_with_path(signature):
        dtype = getattr(info, "tf_dtype", None) or info.dtype  # TFDS >= 4.9.5 deprecates .dtype
        out["/".join(str(p) for p in path)] = f"{tf.as_dtype(dtype).name}{list(info.shape)}"
    return out


def _stats(values: np.ndarray) -> Dict[str, Any]:
    if values.size == 0:
        return {"count": 0}
    return {"count": int(values.shape[0]), "mean": values.mean(axis=0).tolist(), "std": values.std(axis=0).tolist(),
            "min": values.min(axis=0).tolist(), "max": values.max(axis=0).tolist()}


def dataset_summary(name_or_dir: str, *, split: Optional[str] = None, data_dir: Optional[str] = None,
                    max_episodes: Optional[int] = None) -> Dict[str, Any]:
    """What `rlds-tf info` prints, as a dict (also `--json`): metadata, fields, per-split statistics.

    Per split: `episodes` and `steps` counted from the data (the first `max_episodes` if set), `returns`
    (per-episode sums of rewards) and `lengths`, with `{count, mean, std, min, max}` statistics.
    """
    import tensorflow_datasets as tfds  # noqa: PLC0415  (imports TF: after argument parsing)

    from rlds_tf import loading  # noqa: PLC0415  (imports TF: after argument parsing)
    from rlds_tf import rlds_types  # noqa: PLC0415  (imports TF: after argument parsing)

    builder = loading.builder(name_or_dir, data_dir=data_dir)
    features = builder.info.features
    splits = [split] if split else sorted(builder.info.splits.keys())
    summary = {
        "name": builder.info.name,
        "version": str(builder.info.version),
        "directory": os.fspath(builder.data_dir),
        "file_format": builder.info.file_format.value if builder.info.file_format else "tfrecord",
        "step_fields": _describe_features(features[rlds_types.STEPS].feature),
        "episode_fields": {k: v for k, v in _describe_features(
            tfds.features.FeaturesDict({k: features[k] for k in features.keys() if k != rlds_types.STEPS})).items()},
        "splits": {},
    }
    for split_name in splits:
        episodes = loading.load_stacked(name_or_dir, split_name, data_dir=data_dir)
        if max_episodes is not None:
            episodes = episodes.take(max_episodes)
        episodes = episodes.map(lambda e: e[rlds_types.STEPS][rlds_types.REWARD])
        returns, lengths = [], []
        with _read_errors_named(builder, split_name):
            for rewards in tfds.as_numpy(episodes):
                rewards = np.asarray(rewards, dtype=np.float64)
                lengths.append(rewards.shape[0])
                returns.append(rewards.sum(axis=0))
        returns_array = np.asarray(returns, dtype=np.float64)
        lengths_array = np.asarray(lengths, dtype=np.int64)
        summary["splits"][split_name] = {
            "episodes": len(lengths), "steps": int(lengths_array.sum()),
            "episodes_in_metadata": int(builder.info.splits[split_name].num_examples),
            "returns": _stats(returns_array), "lengths": _stats(lengths_array.astype(np.float64)),
            "_returns": returns_array, "_lengths": lengths_array,
        }
    return summary


@contextlib.contextmanager
def _read_errors_named(builder, split: str):
    """Turns a TF error while reading `split` into a one-line ValueError naming the shard and record."""
    import tensorflow as tf  # noqa: PLC0415  (imports TF: after argument parsing)

    from rlds_tf import _record_checks  # noqa: PLC0415  (imports TF: after argument parsing)

    try:
        yield
    except tf.errors.OpError as e:
        raise ValueError(_record_checks.describe_read_error(builder, split, e)) from e


def _format_number(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_format_number(v) for v in value) + "]"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _print_summary(summary: Dict[str, Any]) -> None:
    print(f"dataset: {summary['name']} {summary['version']} ({summary['file_format']})")
    print(f"directory: {summary['directory']}")
    print("step fields:")
    for field, spec in summary["step_fields"].items():
        print(f"  {field:<24} {spec}")
    if summary["episode_fields"]:
        print("episode fields:")
        for field, spec in summary["episode_fields"].items():
            print(f"  {field:<24} {spec}")
    for split, stats in summary["splits"].items():
        print(f"split {split}: {stats['episodes']} episodes, {stats['steps']} steps")
        for key in ("returns", "lengths"):
            s = stats[key]
            if s["count"]:
                print(f"  {key:<8} mean {_format_number(s['mean'])}  std {_format_number(s['std'])}  "
                      f"min {_format_number(s['min'])}  max {_format_number(s['max'])}")


def _plot(summary: Dict[str, Any], path: str) -> None:
    import matplotlib  # noqa: PLC0415  (optional: only --plot needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  (imports TF: after argument parsing)

    figure, (returns_axis, lengths_axis) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for split, stats in summary["splits"].items():
        returns_axis.plot(stats["_returns"], marker=".", label=split)
        lengths_axis.plot(stats["_lengths"], marker=".", label=split)
    returns_axis.set_ylabel("return")
    lengths_axis.set_ylabel("episode length")
    lengths_axis.set_xlabel("episode")
    returns_axis.legend()
    returns_axis.set_title(f"{summary['name']} {summary['version']}")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def info(args: argparse.Namespace) -> int:
    if args.plot:
        try:
            import matplotlib  # noqa: F401, PLC0415
        except ImportError:
            print("rlds-tf info: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
    try:
        summary = dataset_summary(args.dataset, split=args.split, data_dir=args.data_dir,
                                  max_episodes=args.max_episodes)
    except (FileNotFoundError, ValueError) as e:
        print(f"rlds-tf info: {e}", file=sys.stderr)
        return 1
    if args.json:
        public = {k: v for k, v in summary.items() if k != "splits"}
        public["splits"] = {s: {k: v for k, v in stats.items() if not k.startswith("_")}
                            for s, stats in summary["splits"].items()}
        print(json.dumps(public, indent=2))
    else:
        _print_summary(summary)
    if args.plot:
        _plot(summary, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _dataset_config(builder):
    """A `DatasetConfig` with the source's features (episode fields other than `steps` become metadata)."""
    from rlds_tf.recording import tfds_writer  # noqa: PLC0415  (imports TF: after argument parsing)

    info = builder.info
    return tfds_writer.dataset_config(info.features, name=info.name, description=info.description,
                                      homepage=info.homepage, citation=info.citation)


def convert(src: str, dst: str, file_format: str, *, data_dir: Optional[str] = None,
            max_episodes_per_file: int = 1000) -> Dict[str, int]:
    """Copies the dataset `src` into `dst` in `file_format`; returns `{split: episodes written}`.

    The episode records are copied byte for byte (the features do not change, so nothing is decoded or
    re-encoded: JPEG frames keep their exact bytes), in each split's order, `max_episodes_per_file` to a
    shard; each record is still parsed with the dataset's features, so a corrupt source is refused.

    The dataset is written into a hidden sibling directory of `dst` and renamed to `dst` only once every
    episode is written: a failed conversion (unreadable source, full disk, interrupt) leaves no `dst`
    that looks like a complete dataset.

    Raises:
      ValueError: bad arguments, or an unreadable source record (names the shard and record).
    """
    from rlds_tf import _raw_records  # noqa: PLC0415  (imports TF: after argument parsing)
    from rlds_tf import loading  # noqa: PLC0415  (imports TF: after argument parsing)
    from rlds_tf.recording import tfds_writer  # noqa: PLC0415  (imports TF: after argument parsing)

    if file_format not in _FORMATS:
        raise ValueError(f"format ({file_format!r}) must be one of {list(_FORMATS)}")
    builder = loading.builder(src, data_dir=data_dir)
    if os.path.abspath(os.fspath(builder.data_dir)) == os.path.abspath(dst):
        raise ValueError(f"DST ({dst!r}) must differ from the source directory")
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise ValueError(f"DST ({dst!r}) is a file; give a new directory")
    if os.path.exists(dst) and os.listdir(dst):
        raise ValueError(f"DST ({dst!r}) exists and is not empty; give a new directory")
    splits = sorted(builder.info.splits.keys())
    counts = {}
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    partial = tfds_writer.partial_sibling(dst)
    os.mkdir(partial)  # (honours the umask)
    try:
        writer = tfds_writer.DatasetWriter(partial, _dataset_config(builder), split_names=splits,
                                           max_episodes_per_file=max_episodes_per_file,
                                           version=str(builder.info.version), file_format=file_format,
                                           overwrite=True)
        try:
            for split in splits:
                counts[split] = 0
                with _read_errors_named(builder, split):
                    for record in _raw_records.split_records(builder, split):
                        writer.add_serialized(record, split=split)
                        counts[split] += 1
        finally:
            writer.close()
        if os.path.isdir(dst):
            os.rmdir(dst)  # empty when checked above; raises, replacing nothing, if something was added since
        os.rename(partial, dst)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return counts


_BEAM_MISSING = "needs Apache Beam, which is not installed here: pip install rl-data-tf[beam]"


def _uses_beam(args: argparse.Namespace) -> bool:
    return getattr(args, "runner", None) is not None or getattr(args, "num_workers", None) is not None


def _beam_pipelines(args: argparse.Namespace):
    """(`rlds_tf.beam.pipelines`, the pipeline options), or None after printing why not (no Beam installed,
    or arguments that no Beam PipelineOptions takes)."""
    try:
        import apache_beam  # noqa: F401, PLC0415  (optional: only the Beam paths need it)
    except ImportError:
        print(f"rlds-tf {args.command}: --runner/--num-workers {_BEAM_MISSING}", file=sys.stderr)
        return None
    from rlds_tf.beam import pipelines  # noqa: PLC0415  (imports TF and Beam: after argument parsing)

    unknown = pipelines.unknown_options(args.beam_args)
    if unknown:  # Beam would drop them silently: most often a mistyped rlds-tf option
        print(f"rlds-tf {args.command}: unrecognized arguments: {' '.join(unknown)} (neither rlds-tf "
              f"{args.command} nor any of Beam's PipelineOptions takes them; see rlds-tf {args.command} --help)",
              file=sys.stderr)
        return None
    return pipelines, pipelines.pipeline_options(args.runner, args.num_workers, args.beam_args)


def convert_command(args: argparse.Namespace) -> int:
    try:
        if _uses_beam(args):
            beam = _beam_pipelines(args)
            if beam is None:
                return 2
            pipelines, options = beam
            counts = pipelines.convert(args.src, args.dst, args.format, options=options,
                                       max_episodes_per_file=args.max_episodes_per_file)
        else:
            counts = convert(args.src, args.dst, args.format, data_dir=args.data_dir,
                             max_episodes_per_file=args.max_episodes_per_file)
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f"rlds-tf convert: {e}", file=sys.stderr)
        return 1
    written = ", ".join(f"{split}: {n} episodes" for split, n in counts.items())
    print(f"wrote {args.dst} ({args.format}): {written}")
    return 0


def dataset_statistics(name_or_dir: str, *, split: Optional[str] = None,
                       data_dir: Optional[str] = None) -> Dict[str, Any]:
    """What `rlds-tf stats` prints, from one process: `{split: {'episodes', 'fields': {path: {count, mean,
    std, min, max}}}}` over every numeric step field (std: sample, divided by count - 1)."""
    import tensorflow_datasets as tfds  # noqa: PLC0415  (imports TF: after argument parsing)

    from rlds_tf import loading  # noqa: PLC0415  (imports TF: after argument parsing)
    from rlds_tf import step_statistics  # noqa: PLC0415  (imports numpy only, with the TF modules above)

    builder = loading.builder(name_or_dir, data_dir=data_dir)
    known = sorted(builder.info.splits.keys())
    if split is not None and split not in known:
        raise ValueError(f"unknown split {split!r}; the dataset has splits {known}")
    out = {}
    for split_name in [split] if split else known:
        statistics = step_statistics.StepStatistics()
        with _read_errors_named(builder, split_name):
            for episode in tfds.as_numpy(loading.load_stacked(name_or_dir, split_name, data_dir=data_dir)):
                statistics.add_episode(episode)
        out[split_name] = step_statistics.to_json(statistics.num_episodes, statistics.result())
    return out


def _print_statistics(summary: Dict[str, Any]) -> None:
    for split, stats in summary.items():
        print(f"split {split}: {stats['episodes']} episodes")
        for field, s in stats["fields"].items():
            figures = []
            for key in ("mean", "std", "min", "max"):
                values = np.asarray(s[key], dtype=np.float64)
                # Wide fields (images) print their range over elements; --json gives every element.
                figures.append(f"{key} {_format_number(values.tolist())}" if values.size <= 8 else
                               f"{key} {_format_number(float(values.min()))}..{_format_number(float(values.max()))}")
            print(f"  {field:<24} count {s['count']}  " + "  ".join(figures))


def _write_statistics(summary: Dict[str, Any], path: str) -> None:
    """The figures as one line of strict JSON, what the Beam path's workers write to `--output`."""
    import tensorflow as tf  # noqa: PLC0415  (imports TF: after argument parsing)

    with tf.io.gfile.GFile(path, "w") as f:  # local paths and the file systems TF reaches (gs://...)
        f.write(json.dumps(summary, allow_nan=False))


def stats_command(args: argparse.Namespace) -> int:
    try:
        if _uses_beam(args):
            beam = _beam_pipelines(args)
            if beam is None:
                return 2
            pipelines, options = beam
            summary = pipelines.stats(args.directory, options=options, split=args.split, output=args.output)
        else:
            summary = dataset_statistics(args.directory, split=args.split, data_dir=args.data_dir)
            if args.output is not None:
                _write_statistics(summary, args.output)
    except (FileNotFoundError, ValueError, ImportError, OSError) as e:
        print(f"rlds-tf stats: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, indent=2, allow_nan=False))  # to_json made NaN null: strict JSON
    else:
        _print_statistics(summary)
    return 0


def recover_command(args: argparse.Namespace) -> int:
    from rlds_tf.recording import crash_recovery  # noqa: PLC0415  (imports TF: after argument parsing)

    directory = os.path.expanduser(args.directory)
    if not os.path.isdir(directory):
        print(f"rlds-tf recover: {directory!r} is not a directory", file=sys.stderr)
        return 1
    try:
        changed = crash_recovery.recover(directory)
        remaining = crash_recovery.plan(directory)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"rlds-tf recover: {e}", file=sys.stderr)
        return 1
    left_alone = remaining.left_alone if remaining is not None else []
    if left_alone:  # recover() logged why for each, and how to fix it
        names = ", ".join(os.path.basename(path) for path, _ in left_alone)
        print(f"rlds-tf recover: {'partly recovered' if changed else 'could not recover'} {directory}: left "
              f"{len(left_alone)} shard(s) alone ({names}; the warnings above say why)", file=sys.stderr)
        return 1
    print(f"recovered {directory}" if changed else f"{directory} needs no recovery")
    return 0


def _add_beam_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runner", default=None,
                        help="run on Apache Beam with this runner (DirectRunner, FlinkRunner, SparkRunner, "
                             "DataflowRunner, ...); further --options go to Beam's PipelineOptions")
    parser.add_argument("--num-workers", type=int, default=None, metavar="N",
                        help="Beam workers (DirectRunner: N processes); implies --runner DirectRunner")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlds-tf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info_parser = commands.add_parser("info", help="episodes, steps, fields and return statistics of a dataset")
    info_parser.add_argument("dataset", metavar="DIR_OR_NAME", help="dataset directory or registered TFDS name")
    info_parser.add_argument("--split", default=None, help="one split (default: every split)")
    info_parser.add_argument("--data-dir", default=None, help="TFDS data dir, for dataset names")
    info_parser.add_argument("--max-episodes", type=int, default=None, metavar="N",
                             help="read only the first N episodes of each split (large datasets)")
    info_parser.add_argument("--plot", default=None, metavar="PNG",
                             help="save a plot of per-episode returns and lengths (needs matplotlib)")
    info_parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    info_parser.set_defaults(run=info)
    convert_parser = commands.add_parser("convert", help="copy a dataset's episode records, unchanged, into "
                                                          "tfrecord or array_record shards")
    convert_parser.add_argument("src", metavar="SRC", help="dataset directory or registered TFDS name")
    convert_parser.add_argument("dst", metavar="DST", help="new (or empty) output directory")
    convert_parser.add_argument("--format", required=True, choices=_FORMATS, help="on-disk format of DST")
    convert_parser.add_argument("--data-dir", default=None, help="TFDS data dir, for dataset names")
    convert_parser.add_argument("--max-episodes-per-file", type=int, default=1000, metavar="N",
                                help="episodes per shard of DST (default 1000)")
    _add_beam_arguments(convert_parser)
    convert_parser.set_defaults(run=convert_command)
    stats_parser = commands.add_parser("stats", help="count, mean, std, min, max of every numeric step field")
    stats_parser.add_argument("directory", metavar="DIR", help="dataset directory or registered TFDS name")
    stats_parser.add_argument("--split", default=None, help="one split (default: every split)")
    stats_parser.add_argument("--data-dir", default=None, help="TFDS data dir, for dataset names")
    stats_parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    stats_parser.add_argument("--output", default=None, metavar="PATH",
                              help="also write the figures to PATH as JSON (on Beam the workers write it: "
                                   "default a local temporary file; give a shared path such as gs://... on a "
                                   "cluster)")
    _add_beam_arguments(stats_parser)
    stats_parser.set_defaults(run=stats_command)
    recover_parser = commands.add_parser("recover", help="repair a directory left by a killed recorder")
    recover_parser.add_argument("directory", metavar="DIR", help="dataset directory holding dataset_info.json")
    recover_parser.set_defaults(run=recover_command)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `rlds-tf` console script."""
    parser = _parser()
    args, beam_args = parser.parse_known_args(argv)
    if beam_args and not _uses_beam(args):
        parser.error(f"unrecognized arguments: {' '.join(beam_args)} (options for Beam's PipelineOptions are "
                     f"taken only with --runner or --num-workers, by `convert` and `stats`)")
    args.beam_args = beam_args
    if _uses_beam(args) and getattr(args, "data_dir", None) is not None:
        # The Beam workers read shards by path: a TFDS name with a data dir would have to resolve on each.
        parser.error(f"--data-dir is not taken with --runner/--num-workers; give the dataset directory itself "
                     f"(the one holding dataset_info.json, e.g. {os.path.join(args.data_dir, 'NAME', 'VERSION')})")
    if getattr(args, "num_workers", None) is not None and args.num_workers < 1:
        print(f"rlds-tf {args.command}: --num-workers ({args.num_workers}) must be >= 1", file=sys.stderr)
        return 2
    if getattr(args, "max_episodes", None) is not None and args.max_episodes < 1:
        print(f"rlds-tf info: --max-episodes ({args.max_episodes}) must be >= 1", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
