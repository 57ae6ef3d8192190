"""Every `rlds.transformations` function and `reverb.PatternDataset`, called inside traced code.

This file runs unchanged in two interpreters: here with `rlds_tf` / `replay_tf`, and in the peer venv with
rlds 0.1.8 / dm-reverb 0.14 (`test_traced_transformations.py` loads it by path in both, with
`episodes_testlib` importable). It imports neither: `run_all(rlds, reverb)` gets the modules. It is a real
file rather than a string so that AutoGraph can read the source of its functions and converts them (and,
through them, the library code they call) as it does in user code.

Each case is a function of one episode (a dict whose `steps` is a `tf.data.Dataset`) or of a dataset of
episodes, returning a dataset or a nest of tensors. Each context calls it where real code does:

  eager          once per episode, eagerly (only when asked for: the reference where rlds cannot run)
  flat_map       `episodes.flat_map(lambda e: case(e))` (a value becomes a one-element dataset)
  interleave     the same through a parallel, deterministic `interleave`
  map            `episodes.map(lambda e: case(e))` (a dataset becomes a nested dataset)
  tf_function    `tf.function(case)(e)` once per episode
  no_autograph   `flat_map` whose function AutoGraph leaves alone (as TF1-style graph code runs)
Cases of a dataset of episodes see a one-episode dataset (`Dataset.from_tensors(e)`) in those, and also:
  eager_all, tf_function_all   the whole episodes dataset, eagerly and in a `tf.function`.

`run_all` returns `{f"{case}/{context}": ("ok", elements) or ("error", message)}`, where `elements` is the
list of what came out (nested datasets listed too), each a nest of numpy arrays.
"""
import numpy as np
import tensorflow as tf

import episodes_testlib

# Episodes 0 and 2 end in a terminal state, episode 1 is truncated.
LENGTHS = [3, 5, 4]
DATA = episodes_testlib.steps_data(LENGTHS, seed=7, observation_size=2)
STARTS = episodes_testlib.episode_starts(LENGTHS)
TRACED_CONTEXTS = ("flat_map", "interleave", "map", "tf_function", "no_autograph")
WHOLE_CONTEXTS = ("eager_all", "tf_function_all")


def steps_dataset():
    return episodes_testlib.steps_dataset(DATA)


def episodes_dataset():
    """Three episodes of 3, 5 and 4 steps; each episode's steps are a nested dataset (as TFDS loads them)."""
    return episodes_testlib.episodes_dataset(DATA, LENGTHS)


def listed(value):
    """What `value` holds as a list of elements: a dataset's elements (a nested dataset among them is spliced
    in), or the value itself; each element a nest of numpy arrays with nested datasets as lists."""
    if not isinstance(value, tf.data.Dataset):
        return [_numpy(value)]
    out = []
    for element in value:
        if isinstance(element, tf.data.Dataset):
            out.extend(listed(element))
        else:
            out.append(_numpy(element))
    return out


def _numpy(nest):
    def leaf(x):
        if isinstance(x, tf.data.Dataset):
            return [_numpy(e) for e in x]
        return np.asarray(x.numpy() if tf.is_tensor(x) else x)  # (strings: bytes, not numpy objects)
    return tf.nest.map_structure(leaf, nest)


def _as_dataset(value):
    return value if isinstance(value, tf.data.Dataset) else tf.data.Dataset.from_tensors(value)


def _in_eager(case, episodes):
    return [x for episode in episodes for x in listed(case(episode))]


def _in_flat_map(case, episodes):
    def per_episode(episode):
        return _as_dataset(case(episode))
    return listed(episodes.flat_map(per_episode))


def _in_interleave(case, episodes):
    # Blocks longer than any output: the order is that of the episodes, however the calls overlap.
    def per_episode(episode):
        return _as_dataset(case(episode))
    return listed(episodes.interleave(per_episode, cycle_length=2, block_length=1000, num_parallel_calls=2,
                                      deterministic=True))


def _in_map(case, episodes):
    def per_episode(episode):
        return case(episode)
    return listed(episodes.map(per_episode))


def _in_tf_function(case, episodes):
    traced = tf.function(case)
    return [x for episode in episodes for x in listed(traced(episode))]


def _in_flat_map_without_autograph(case, episodes):
    @tf.autograph.experimental.do_not_convert
    def per_episode(episode):
        return _as_dataset(case(episode))
    return listed(episodes.flat_map(per_episode))


_RUNNERS = {"eager": _in_eager, "flat_map": _in_flat_map, "interleave": _in_interleave, "map": _in_map,
            "tf_function": _in_tf_function, "no_autograph": _in_flat_map_without_autograph}


def _cases(rlds, reverb):
    """name -> (kind, function): kind "episode" takes one episode, "episodes" a dataset of episodes."""
    T = rlds.transformations
    structured = reverb.structured_writer
    step_spec = steps_dataset().element_spec

    def double_reward(step):
        return dict(step, reward=step["reward"] * 2)

    def to_sum(step):
        return {"r": step["reward"], "o": step["observation"], "n": tf.constant(1)}

    def absorbing(last_step):
        return tf.data.Dataset.from_tensors(dict(last_step, is_first=False, reward=tf.constant(0.5))).repeat(2)

    def high_reward(step):
        return step["reward"] > 0.5

    def action_divisible_by_3(step):
        return step["action"] % 3 == 0

    def not_first(step):
        return step["action"] != 0

    def with_sar(step):
        return T.add_alignment_to_step(step, T.AlignmentType.SAR)

    def transition(ref):
        return {"o": ref["observation"][-2], "a": ref["action"][-2], "next_o": ref["observation"][-1]}

    def configs():
        # Fresh protos per call: dm-reverb's PatternDataset appends a condition to the configs it is given.
        ref = structured.create_reference_step(step_spec)
        pairs = structured.create_config({"a": ref["action"][-2:], "r": ref["reward"][-1]}, table="items")
        every_other = structured.create_config(
            {"a": ref["action"][-2:], "r": ref["reward"][-2]}, table="items",
            conditions=[structured.Condition.step_index() % 2 == 0])
        at_end = structured.create_config(
            {"a": ref["action"][-2:], "r": ref["reward"][-2]}, table="items",
            conditions=[structured.Condition.is_end_episode()])
        return [pairs, every_other, at_end]

    def is_last(step):
        return step["is_last"]

    def spec_strings(spec):
        return {k: tf.constant(f"{v.dtype.name} {v.shape}") for k, v in spec.items()}

    def uniform_shapes(steps):
        spec = {"o": steps.element_spec["observation"], "r": steps.element_spec["reward"]}
        values = T.uniform_from_spec(spec, 0.0, 1.0, seed=3)  # random: compared by shape, dtype and range
        return {"zeros": tf.nest.map_structure(tf.zeros_like, values),
                "in_range": tf.reduce_all([tf.reduce_all((v >= 0) & (v < 1)) for v in tf.nest.flatten(values)])}

    def mean_and_std(episodes):
        mean, std = T.mean_and_std(episodes, T.sar_fields_mask)
        return {"mean": mean, "std": std}

    extra = tf.data.Dataset.from_tensors({"observation": tf.zeros([2]), "absorbing": True})
    return {
        # The idiom users write most: overlapping pairs of steps of every episode.
        "batch_2_1_drop": ("episode", lambda e: T.batch(e["steps"], size=2, shift=1, drop_remainder=True)),
        "batch_3_2_stride_2": ("episode", lambda e: T.batch(e["steps"], size=3, shift=2, stride=2)),
        "map_steps": ("episode", lambda e: T.map_steps(e["steps"], double_reward)),
        "map_nested_steps": ("episodes", lambda ds: T.map_nested_steps(ds, double_reward)),
        "apply_nested_steps": ("episodes", lambda ds: T.apply_nested_steps(ds, lambda s: s.skip(1))),
        "sum_dataset": ("episode", lambda e: T.sum_dataset(e["steps"], to_sum)),
        "sum_nested_steps": ("episodes", lambda ds: T.sum_nested_steps(ds, to_sum)),
        "final_step": ("episode", lambda e: T.final_step(e["steps"])),
        "final_step_unknown": ("episode", lambda e: T.final_step(e["steps"].filter(not_first))),
        "episode_length": ("episode", lambda e: T.episode_length(e["steps"])),
        "episode_length_unknown": ("episode", lambda e: T.episode_length(e["steps"].filter(action_divisible_by_3))),
        "concatenate": ("episode", lambda e: T.concatenate(e["steps"], extra)),
        "concat_if_terminal": ("episode", lambda e: T.concat_if_terminal(e["steps"], absorbing)),
        "truncate_after_condition": ("episode", lambda e: T.truncate_after_condition(e["steps"], high_reward)),
        "mean_and_std": ("episodes", mean_and_std),
        "sar_fields_mask": ("episode", lambda e: e["steps"].map(T.sar_fields_mask)),
        "shift_keys": ("episode", lambda e: T.shift_keys(e["steps"], ["action"], 1)),
        "add_alignment_to_step": ("episode", lambda e: e["steps"].map(with_sar)),
        "zeros_from_spec": ("episode", lambda e: T.zeros_from_spec(e["steps"].element_spec)),
        "zero_dataset_like": ("episode", lambda e: T.zero_dataset_like(e["steps"])),
        "uniform_from_spec": ("episode", lambda e: uniform_shapes(e["steps"])),
        "step_spec": ("episodes", lambda ds: spec_strings(T.step_spec(ds))),
        "pattern_map": ("episodes", lambda ds: T.pattern_map(ds, configs())),
        "pattern_map_across": ("episodes", lambda ds: T.pattern_map(ds, configs()[:1],
                                                                    respect_episode_boundaries=False)),
        "pattern_map_from_transform": ("episodes", lambda ds: T.pattern_map_from_transform(ds, transition)),
        "PatternDataset": ("episode", lambda e: reverb.PatternDataset(e["steps"], configs(), True, is_last)),
    }


def _on_one_episode(fn):
    def per_episode(episode):
        return fn(tf.data.Dataset.from_tensors(episode))
    return per_episode


def _describe(error):
    return f"{type(error).__name__}: {str(error)[:400]}"


def case_kinds(rlds, reverb):
    """name -> "episode" or "episodes" for every case."""
    return {name: kind for name, (kind, _) in _cases(rlds, reverb).items()}


def contexts_of(kind):
    """The contexts a case of this kind runs in by default (all but "eager")."""
    return TRACED_CONTEXTS + WHOLE_CONTEXTS if kind == "episodes" else TRACED_CONTEXTS


def run_all(rlds, reverb, names=None, contexts=None):
    """Runs the cases (all, or those in `names`) in the contexts of `contexts_of` (or in those of
    `contexts` that apply to them; "eager" runs only when asked for)."""
    results = {}
    for name, (kind, fn) in _cases(rlds, reverb).items():
        if names is not None and name not in names:
            continue
        per_episode = fn if kind == "episode" else _on_one_episode(fn)
        runs = {}
        for context in ("eager",) + contexts_of(kind):
            if context not in (contexts_of(kind) if contexts is None else contexts):
                continue
            if context == "eager_all":
                runs[context] = lambda fn=fn: listed(fn(episodes_dataset()))
            elif context == "tf_function_all":
                runs[context] = lambda fn=fn: listed(tf.function(fn)(episodes_dataset()))
            else:
                runs[context] = lambda run=_RUNNERS[context]: run(per_episode, episodes_dataset())
        for context, run in runs.items():
            try:
                results[f"{name}/{context}"] = ("ok", run())
            except Exception as error:  # pylint: disable=broad-except  (recorded and compared)
                results[f"{name}/{context}"] = ("error", _describe(error))
    return results
