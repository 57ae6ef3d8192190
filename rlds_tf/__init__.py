"""rlds_tf: RLDS episodes, recording, transformations and patterns on current TensorFlow."""
