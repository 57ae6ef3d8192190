"""Everything between a table (or a remote sample stream) and the `tf.data` elements of a sample dataset."""
