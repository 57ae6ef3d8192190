"""When TensorFlow's eager runtime starts under TF1 graph code (docs/compatibility.md, "Real programs and
Reverb's own tests"): virtual devices can only be configured before it does.

Building our datasets in a graph leaves it alone (tests/replay_tf/test_dataset_dropin.py). Running one in a
session starts it, because every call of a Python op makes TensorFlow's PyFunc kernel initialize the eager
context; dm-reverb's dataset is one C++ op and leaves it alone. Each case runs in a fresh process, as
Reverb's `timestep_dataset_test` runs `test_converts_spec_lists_into_tuples` and then
`test_distribution_strategy`.
"""
import os
import subprocess
import sys
import textwrap

import pytest

_CONFIGURE_DEVICES = """
cpu = tf.config.list_physical_devices('CPU')[0]
try:
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    print('devices', len(tf.config.list_logical_devices('CPU')))
except RuntimeError as e:
    print('RuntimeError', e)
"""

_PYTHON_OP = """
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
with tf.Graph().as_default():
    value = tf.numpy_function(lambda: np.int64(1), [], tf.int64)
    with tf.compat.v1.Session() as session:
        session.run(value)
"""

# Reverb's test, in short: insert, iterate a TimestepDataset in a TF1 session, then configure devices.
_TIMESTEP_DATASET = """
import sys
import numpy as np
import tensorflow as tf
if sys.argv[1] == 'reverb':
    import reverb
else:
    import replay_tf as reverb
tf.compat.v1.disable_eager_execution()
server = reverb.Server([reverb.Table.queue('dist', 10)])
client = reverb.Client(f'localhost:{server.port}')
for _ in range(3):
    client.insert([np.ones([1, 1], np.int32)], {'dist': 1})
with tf.Graph().as_default():
    dataset = reverb.TimestepDataset(client.server_address, 'dist', dtypes=[tf.int32],
                                     shapes=[tf.TensorShape([1, 1])], max_in_flight_samples_per_worker=1)
    iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    item = iterator.get_next()
    with tf.compat.v1.Session() as session:
        session.run(iterator.initializer)
        session.run(item)
"""


def _run(python: str, code: str, *args: str, ours: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" or ours}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([python, "-c", textwrap.dedent(code) + _CONFIGURE_DEVICES, *args], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_python_op_run_in_a_session_starts_the_eager_runtime():
    # TensorFlow's own behaviour, whoever wrote the op: the reason for the documented difference below.
    assert _run(sys.executable, _PYTHON_OP, ours=True) == (
        "RuntimeError Virtual devices cannot be modified after being initialized")


@pytest.mark.slow
def test_running_our_timestep_dataset_in_a_session_starts_it_too():
    assert _run(sys.executable, _TIMESTEP_DATASET, "replay_tf", ours=True) == (
        "RuntimeError Virtual devices cannot be modified after being initialized")


@pytest.mark.peer
def test_running_reverbs_timestep_dataset_in_a_session_leaves_it_alone(peer):
    assert _run(peer.python, _TIMESTEP_DATASET, "reverb", ours=False) == "devices 4"
