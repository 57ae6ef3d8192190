"""The buffer benchmark's device mode (`RL_DATA_BENCH_DEVICE`): device names map to flashbax's platform,
and a device TensorFlow cannot see stops the run before anything is timed, saying what it sees."""
import pytest
import tensorflow as tf

from benchmarks import bench_buffers


@pytest.mark.parametrize("device, platform", [
    ("gpu:0", "gpu"), ("GPU:1", "gpu"), ("/device:GPU:0", "gpu"), ("/gpu:0", "gpu"),
    ("cpu:0", "cpu"), ("/device:CPU:0", "cpu"), (None, "cpu"),
])
def test_device_names_map_to_flashbax_platforms(device, platform):
    assert bench_buffers._jax_platform(device) == platform


def test_the_device_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("RL_DATA_BENCH_DEVICE", raising=False)
    assert bench_buffers._device() is None
    monkeypatch.setenv("RL_DATA_BENCH_DEVICE", "gpu:0")
    assert bench_buffers._device() == "gpu:0"


@pytest.mark.skipif(bool(tf.config.list_logical_devices("GPU")), reason="this host has a GPU")
def test_a_device_tensorflow_cannot_see_stops_the_run():
    with pytest.raises(SystemExit, match=r"RL_DATA_BENCH_DEVICE='gpu:0': TensorFlow sees no GPU device"):
        bench_buffers._ours("gpu:0")
