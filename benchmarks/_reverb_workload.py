"""The replay-server workload shared by `bench_server` (in-process) and `bench_wire` (over gRPC), as source.

The same text runs here (with `reverb` bound to `replay_tf`) and in the peer venv (dm-reverb), so both
sides of every ratio write and sample exactly the same way: items of 3 overlapping steps, one item per
step (by a trajectory_writer, and by a structured_writer whose config makes the same items), then
`TrajectoryDataset.from_table_signature(...).batch(256)`.
"""

SOURCE = r'''
import time
import numpy as np

def make_steps(obs_shape):
    """64 distinct steps, cycled by `write_items`: (actions f32[64, 2], observations uint8[64, *obs_shape])."""
    rng = np.random.default_rng(0)
    observations = rng.integers(0, 256, size=[64, *obs_shape], dtype=np.uint8)
    return rng.random([64, 2], dtype=np.float32), observations

def write_items(client, table, steps, num_steps, priority=lambda i: 1.0):
    """Steps/s of one trajectory_writer appending `num_steps` steps, creating a 3-step item per step."""
    actions, observations = steps
    start = time.perf_counter()
    with client.trajectory_writer(num_keep_alive_refs=3) as writer:
        for i in range(num_steps):
            writer.append({"action": actions[i % 64], "observation": observations[i % 64]})
            if i >= 2:
                writer.create_item(table, priority(i), {"action": writer.history["action"][-3:],
                                                        "observation": writer.history["observation"][-3:]})
    return num_steps / (time.perf_counter() - start)

def write_structured(client, table, steps, num_steps):
    """Steps/s of one structured_writer appending `num_steps` steps, its one config making the same 3-step
    item per step as `write_items` (the pattern compiled once, applied online to every step)."""
    actions, observations = steps
    sw = reverb.structured_writer
    ref = sw.create_reference_step({"action": actions[0], "observation": observations[0]})
    config = sw.create_config({"action": ref["action"][-3:], "observation": ref["observation"][-3:]}, table)
    writer = client.structured_writer([config])
    start = time.perf_counter()
    for i in range(num_steps):
        writer.append({"action": actions[i % 64], "observation": observations[i % 64]})
    writer.flush()
    return num_steps / (time.perf_counter() - start)

def sample_rate(address, table, obs_shape, num_batches):
    """Best samples/s of `TrajectoryDataset(...).batch(256)` over 2 runs of `num_batches` (after one warm-up),
    and best samples per CPU-second of this process (all threads): on a loaded shared machine wall-clock
    rates swing by 2x and more while CPU efficiency barely moves (blind to parallelism, though)."""
    dataset = reverb.TrajectoryDataset.from_table_signature(address, table, max_in_flight_samples_per_worker=512)
    iterator = iter(dataset.batch(256))
    next(iterator)
    best = best_cpu = 0.0
    for _ in range(2):
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(num_batches):
            batch = next(iterator)
        best = max(best, 256 * num_batches / (time.perf_counter() - start))
        best_cpu = max(best_cpu, 256 * num_batches / max(time.process_time() - cpu_start, 1e-9))
    assert batch.data["observation"].shape == (256, 3, *obs_shape)
    return best, best_cpu
'''
