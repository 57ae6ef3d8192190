"""Reverb's `reverb.item_selectors` (what `reverb.selectors` names): the objects of `replay_tf.selectors`."""
from replay_tf import selectors as _selectors
from replay_tf.selectors import *  # noqa: F401,F403  (the same six selectors)

__all__ = list(_selectors.__all__)
