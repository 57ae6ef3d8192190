"""Chunk lengths of writers talking to a remote server, where every sample carries whole chunks.

dm-reverb 0.14's auto-tuned chunker, writing 3-step items one per step into a server (observed through our
server's chunk store), settles at one step per chunk for an Atari frame (uint8 [84, 84, 4]) and at 2-3
steps for small columns (f32 [2], uint8 [10, 10]); ours picks the same from the step size.
"""
import collections

import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf.writing import column_chunker
from replay_tf.grpc.client import client_transport
from replay_tf.transport import base as transport_lib


@pytest.mark.parametrize("row_bytes, keep_alive, expected", [
    (8, 3, 3),          # f32 [2]: sqrt(4096 / 8) = 22.6, capped at num_keep_alive_refs
    (100, 3, 3),        # uint8 [10, 10]: 6.4 -> capped at 3
    (100, 8, 6),        # 6.4 rounds to 6 under a larger cap
    (1024, 3, 2),       # sqrt(4) = 2
    (2048, 3, 1),       # 1.41 rounds to 1
    (84 * 84 * 4, 3, 1),
    (1 << 30, 1, 1),
    (1, 1, 1),
])
def test_remote_chunk_length_minimises_bytes_moved_per_step(row_bytes, keep_alive, expected):
    assert column_chunker.remote_chunk_length(row_bytes, keep_alive) == expected


def _chunk_lengths_by_column(table) -> dict:
    lengths = collections.defaultdict(collections.Counter)
    for key in list(table._items):  # noqa: SLF001  (white-box: the chunks the server received)
        for chunk in table.get_item(key).chunks.values():
            rows = chunk.sequence_range.end - chunk.sequence_range.start + 1
            lengths[chunk.tensors[0].shape[1:]][rows] += 1
    return lengths


def test_remote_writer_sends_single_step_chunks_for_large_steps_and_long_ones_for_small(monkeypatch):
    monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    signature = {"action": tf.TensorSpec([3, 2], tf.float32), "observation": tf.TensorSpec([3, 84, 84, 4], tf.uint8)}
    server = reverb.Server([reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 100,
                                         reverb.rate_limiters.MinSize(1), signature=signature)])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        rng = np.random.default_rng(0)
        actions = rng.random((20, 2), dtype=np.float32)
        frames = rng.integers(0, 256, (20, 84, 84, 4), dtype=np.uint8)
        with client.trajectory_writer(num_keep_alive_refs=3) as writer:
            for i in range(20):
                writer.append({"action": actions[i], "observation": frames[i]})
                if i >= 2:
                    writer.create_item("t", 1.0, {"action": writer.history["action"][-3:],
                                                  "observation": writer.history["observation"][-3:]})
        lengths = _chunk_lengths_by_column(server.table("t"))
        assert set(lengths[(84, 84, 4)]) == {1}
        assert set(lengths[(2,)]) <= {1, 2, 3} and max(lengths[(2,)]) == 3
        # Sampled back exactly: the Fifo table's first item holds steps 0-2.
        sample = next(iter(client.sample("t", num_samples=1, emit_timesteps=False, unpack_as_table_signature=True)))
        np.testing.assert_array_equal(sample.data["observation"], frames[:3])
        np.testing.assert_array_equal(sample.data["action"], actions[:3])
    finally:
        server.stop()


def test_configured_max_chunk_length_still_overrides_for_remote_writers(monkeypatch):
    chunker = column_chunker.ColumnChunker("obs", np.zeros([84, 84, 4], np.uint8), 3, 3, open_chunks=False)
    assert chunker.max_chunk_length == 3
    chunker = column_chunker.ColumnChunker("obs", np.zeros([84, 84, 4], np.uint8), 3, None, open_chunks=False)
    assert chunker.max_chunk_length == 1
    refs = [chunker.append(np.full([84, 84, 4], i, np.uint8), episode_id=7, step=i) for i in range(3)]
    assert len({id(ref.chunk) for ref in refs}) == 3
    assert [int(ref.chunk.tensors[0][0, 0, 0, 0]) for ref in refs] == [0, 1, 2]
