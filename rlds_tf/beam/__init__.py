"""Apache Beam transforms for RLDS datasets: read, write, pattern-map and summarize them at dataset scale.

Needs the optional extra (`pip install rl-data-tf[beam]`); the rest of rlds_tf imports Beam only in
`rlds-tf convert/stats --runner/--num-workers`. The transforms run on any Beam runner: the DirectRunner
locally (`--direct_num_workers`, `--direct_running_mode=multi_processing`), Flink, Spark or Dataflow by
pipeline options. See docs/scale.md.
"""
from rlds_tf.beam.pattern_map import PatternMap
from rlds_tf.beam.reading import ReadEpisodes
from rlds_tf.beam.statistics import DatasetStatistics
from rlds_tf.beam.writing import WriteEpisodes

__all__ = [
    "DatasetStatistics",
    "PatternMap",
    "ReadEpisodes",
    "WriteEpisodes",
]
