"""rlds_tf.metadata: episode-metadata field names, as `rlds.metadata` (defined in `metadata_types`)."""
from rlds_tf.metadata import metadata_types
from rlds_tf.metadata.metadata_types import AGENT_ID
from rlds_tf.metadata.metadata_types import ENVIRONMENT_CONFIG
from rlds_tf.metadata.metadata_types import EPISODE_ID
from rlds_tf.metadata.metadata_types import EXPERIMENT_ID
from rlds_tf.metadata.metadata_types import INVALID

__all__ = ["AGENT_ID", "ENVIRONMENT_CONFIG", "EPISODE_ID", "EXPERIMENT_ID", "INVALID", "metadata_types"]
