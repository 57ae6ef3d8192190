"""The structured writer with conditions compared with bools (`Condition.data(spec)['is_terminal'] == False`).

dm-reverb 0.14 builds `eq: 0` / `eq: 1` from False / True; `test_matches_reverb` runs the same writer in the
peer, `test_items_of_bool_conditions` checks the items against hand-computed ones.
"""
import numpy as np

import reverb_testlib
import replay_tf as reverb

# is_terminal per step of three episodes: terminal, truncated, one terminal step.
_EPISODES = [[False, False, True], [False, False, False, False], [True]]

_WRITE = """
sw = reverb.structured_writer
spec = {'x': tf.TensorSpec([], tf.int32), 'is_terminal': tf.TensorSpec([], tf.bool)}
ref = sw.create_reference_step(spec)
data = sw.Condition.data(spec)
tables = {'eq_false': data['is_terminal'] == False, 'ne_false': data['is_terminal'] != False,
          'eq_true': data['is_terminal'] == True, 'lt_true': data['is_terminal'] < True}
configs = [sw.create_config({'x': ref['x'][-1], 't': ref['is_terminal'][-1]}, table=name, conditions=[condition])
           for name, condition in tables.items()]
server = reverb.Server([reverb.Table.queue(name, 100) for name in tables])
client = reverb.Client(f'localhost:{server.port}')
writer = client.structured_writer(configs)
x = 0
for episode in EPISODES:
    for is_terminal in episode:
        writer.append({'x': np.int32(x), 'is_terminal': np.bool_(is_terminal)})
        x += 1
    writer.end_episode()
writer.flush()
for name in tables:
    size = client.server_info()[name].current_size
    emit(name, [[np.asarray(v).item() for v in s.data] for s in client.sample(name, size, emit_timesteps=False)])
server.stop()
"""

SCENARIOS = {"bool_conditions": f"EPISODES = {_EPISODES!r}\n{_WRITE}"}

peer_results, local_results, test_matches_reverb = reverb_testlib.differential_tests(SCENARIOS)


def test_items_of_bool_conditions(local_results):
    # Each item is [t, x] (the flattened dict's keys in sorted order).
    not_terminal = [[False, 0], [False, 1], [False, 3], [False, 4], [False, 5], [False, 6]]
    terminal = [[True, 2], [True, 7]]
    assert reverb_testlib.scenario_results(local_results, "bool_conditions") == {
        "eq_false": not_terminal, "ne_false": terminal, "eq_true": terminal, "lt_true": not_terminal}


def test_bool_conditions_round_trip_through_protos():
    # A config built with `== False` is the proto dm-reverb builds (`eq: 0`), so it survives to_proto/from_proto.
    sw = reverb.structured_writer
    ref = sw.create_reference_step({"x": np.int32(0), "done": np.bool_(False)})
    config = sw.create_config(ref["x"][-1], table="t", conditions=[sw.Condition.data(ref)["done"] == False])
    proto = config.to_proto()
    assert (proto.conditions[0].flat_source_index, proto.conditions[0].eq) == (0, 0)
    assert sw.Config.from_proto(proto) == config
