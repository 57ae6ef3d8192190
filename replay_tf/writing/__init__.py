"""What the writers share (`trajectory_writer`, `structured_writer`, `sharded`, `Client.insert`).

column_chunker.py: a column's appended values in its current chunk. columns.py: a column's history and the
`TrajectoryColumn`s taken from it. leaves.py: which leaves can be tensors (dm-reverb's checks). context.py:
the writers' `with` / close lifecycle.

Building blocks of `replay_tf`'s writers, not a public API of their own.
"""
