"""What the writers share (`trajectory_writer`, `structured_writer`, `sharded`, `Client.insert`): the per-column
chunking of appended values, the leaf checks dm-reverb's writers make, and the writers' `with`/close lifecycle.

Building blocks of `replay_tf`'s writers, not a public API of their own.
"""
