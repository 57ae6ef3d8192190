"""`batched_map`: a function applied to (possibly overlapping) batches of steps, as rlds' helper of that name."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import tensorflow as tf

from rlds_tf.transformations import flexible_batch


def batched_map(steps: tf.data.Dataset, map_fn: Callable[[Dict[str, Any]], Dict[str, Any]],
                size: int = flexible_batch.BATCH_AUTO_TUNE, shift: Optional[int] = None,
                stride: int = 1) -> tf.data.Dataset:
    """Applies `map_fn` to batches of steps (`flexible_batch.batch(steps, size, shift, stride)`) and unbatches
    what it returns.

    Args:
      steps: dataset of steps.
      map_fn: function of a batch of steps (fields with a leading batch dimension) to a batch of steps.
      size: steps per batch; BATCH_AUTO_TUNE picks about 200 KB of steps.
      shift: steps between the starts of consecutive batches (default `size`).
      stride: steps between consecutive elements of a batch.

    Returns:
      The dataset of the steps `map_fn` returned, one by one.

    >>> steps = tf.data.Dataset.range(4).map(lambda i: {'x': i})
    >>> [int(s['x']) for s in batched_map(steps, lambda b: {'x': b['x'] * 10}, size=3)]
    [0, 10, 20, 30]
    """
    return flexible_batch.batch(steps, size, shift, stride).map(map_fn).unbatch()
