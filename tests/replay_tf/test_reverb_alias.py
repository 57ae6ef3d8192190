"""replay_tf.register_as_reverb: `import reverb` resolves to replay_tf for code that imports Reverb itself."""
import importlib
import sys
import types

import numpy as np
import pytest

import replay_tf
import replay_tf.checkpointers
import replay_tf.item_selectors
import replay_tf.selectors
import replay_tf.structured_writer
import replay_tf.trajectory_writer


def _reverb_entries():
    return {k: v for k, v in sys.modules.items() if k == "reverb" or k.startswith("reverb.")}


@pytest.fixture
def clean_reverb():
    """Runs the test with no `reverb` in sys.modules and puts back what was there afterwards."""
    saved = _reverb_entries()
    saved_platform = replay_tf.__dict__.get("platform")
    for key in saved:
        del sys.modules[key]
    yield
    for key in _reverb_entries():
        del sys.modules[key]
    sys.modules.update(saved)
    if saved_platform is None:
        replay_tf.__dict__.pop("platform", None)
    else:
        replay_tf.platform = saved_platform


def test_import_reverb_gives_replay_tf(clean_reverb):
    with pytest.raises(ImportError):
        importlib.import_module("reverb")  # not installed in this environment: nothing to shadow
    assert replay_tf.register_as_reverb() is replay_tf
    import reverb
    assert reverb is replay_tf
    assert reverb.Server is replay_tf.Server and reverb.Table is replay_tf.Table
    assert reverb.selectors.Fifo is replay_tf.selectors.Fifo


@pytest.mark.parametrize("name, expected", [
    ("reverb.trajectory_writer", replay_tf.trajectory_writer),
    ("reverb.structured_writer", replay_tf.structured_writer),
    ("reverb.item_selectors", replay_tf.item_selectors),
    ("reverb.selectors", replay_tf.selectors),
    ("reverb.platform.checkpointers_lib", replay_tf.checkpointers),
    ("reverb.platform.default.checkpointers", replay_tf.checkpointers),
])
def test_submodules_resolve(clean_reverb, name, expected):
    replay_tf.register_as_reverb()
    assert importlib.import_module(name) is expected


def test_submodule_names_as_tf_agents_and_rlds_use_them(clean_reverb):
    replay_tf.register_as_reverb()
    import reverb
    from reverb import replay_sample, rate_limiters, tf_client
    assert replay_sample.SampleInfo is reverb.SampleInfo
    assert rate_limiters.MinSize is replay_tf.rate_limiters.MinSize
    assert tf_client.TFClient is reverb.TFClient
    assert reverb.structured_writer.pattern_from_transform is replay_tf.structured_writer.pattern_from_transform
    assert reverb.platform.checkpointers_lib.DefaultCheckpointer is replay_tf.checkpointers.DefaultCheckpointer


def test_code_written_for_reverb_runs_through_the_alias(clean_reverb):
    replay_tf.register_as_reverb()
    import reverb
    server = reverb.Server([reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 10,
                                         reverb.rate_limiters.MinSize(1))])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        client.insert([np.int32(7)], priorities={"t": 1.0})
        sample = next(client.sample("t"))
        assert int(sample[0].data[0]) == 7
    finally:
        server.stop()


def test_idempotent(clean_reverb):
    first = replay_tf.register_as_reverb()
    entries = _reverb_entries()
    assert replay_tf.register_as_reverb() is first
    after = _reverb_entries()
    assert after.keys() == entries.keys()
    assert all(after[k] is entries[k] for k in entries)


@pytest.mark.parametrize("foreign_name", ["reverb", "reverb.client", "reverb.platform.default"])
def test_refuses_a_foreign_reverb(clean_reverb, foreign_name):
    foreign = types.ModuleType(foreign_name)
    sys.modules[foreign_name] = foreign
    with pytest.raises(RuntimeError, match=rf"already holds a different `reverb` \({foreign_name}="):
        replay_tf.register_as_reverb()
    assert sys.modules[foreign_name] is foreign  # nothing replaced
    assert [k for k in _reverb_entries() if k != foreign_name] == []
