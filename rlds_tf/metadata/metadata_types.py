"""Episode-metadata field names suggested by RLDS (values match `rlds.metadata`)."""

EPISODE_ID = "episode_id"
AGENT_ID = "agent_id"
ENVIRONMENT_CONFIG = "environment_config"
EXPERIMENT_ID = "experiment_id"
INVALID = "invalid"
