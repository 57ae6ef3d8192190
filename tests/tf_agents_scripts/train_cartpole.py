"""Trains a TF-Agents 0.19 agent on CartPole through its Reverb replay buffer, with replay_tf as `reverb`.

Run by `tests/test_tf_agents_training.py` in the TF-Agents venv (`.ci/make_tf_agents_venv.sh`: current TF,
tf-keras, tf-agents 0.19) with the repository root on PYTHONPATH; not a test module itself (pytest imports
it for doctests in the main env, where nothing below `main` runs).

It is TF-Agents' own `tf_agents.train` loop, as in `tf_agents/examples/dqn/dqn_train_eval.py` and
`examples/ppo/schulman17/train_eval_lib.py`: `Actor`s collect into Reverb tables through
`ReverbAddTrajectoryObserver`, a `Learner` (`PPOLearner` for PPO) trains from
`ReverbReplayBuffer.as_dataset`, and `triggers.ReverbCheckpointTrigger` checkpoints the server's data. The
only change a user makes is `replay_tf.register_as_reverb()` before TF-Agents first uses `reverb`.

    python tests/tf_agents_scripts/train_cartpole.py --agent dqn|ppo [--server-address HOST:PORT]
        --root-dir DIR --out result.json

Without `--server-address` the tables live in an in-process `reverb.Server` (with a checkpointer under
`--root-dir`); with it, they are the tables of a running server (`replay-tf serve`, see
`TABLES_CONFIG`). The result file holds the greedy policy's average return on fixed-seed evaluation
episodes before training and at evaluations during it (`curve`: [train step, return] pairs), the train
steps taken, the checkpoints the trigger wrote (in-process server) and the items each table accepted.
"""
import argparse
import json
import os
import random

ENV_NAME = "CartPole-v0"
SEED = 1
DQN_TABLE = "uniform_table"
PPO_TABLES = ("training_table", "normalization_table")

# The tables each agent uses, in `replay-tf serve --config` form (the in-process server builds the same).
TABLES_CONFIG = {
    "dqn": {"tables": [{"name": DQN_TABLE, "sampler": "uniform", "remover": "fifo", "max_size": 100000,
                        "rate_limiter": {"min_size": 1}}]},
    "ppo": {"tables": [{"name": name, "sampler": "fifo", "remover": "fifo", "max_size": 10000,
                        "max_times_sampled": 1, "rate_limiter": {"min_size": 1}} for name in PPO_TABLES]},
}


def _tables(reverb, agent_name):
    """`TABLES_CONFIG[agent_name]` built with Reverb's API, for an in-process `reverb.Server`."""
    tables = []
    for config in TABLES_CONFIG[agent_name]["tables"]:
        sampler = reverb.selectors.Uniform() if config["sampler"] == "uniform" else reverb.selectors.Fifo()
        tables.append(reverb.Table(config["name"], sampler=sampler, remover=reverb.selectors.Fifo(),
                                   max_size=config["max_size"],
                                   max_times_sampled=config.get("max_times_sampled", 0),
                                   rate_limiter=reverb.rate_limiters.MinSize(1)))
    return tables


def _average_return(env, policy, episodes, seed):
    """The policy's mean undiscounted return over `episodes` episodes, the environment reseeded first so
    the evaluation before and after training sees the same start states."""
    env.seed(seed)
    total = 0.0
    for _ in range(episodes):
        time_step = env.reset()
        state = policy.get_initial_state(env.batch_size)
        while not time_step.is_last():
            action_step = policy.action(time_step, state)
            state = action_step.state
            time_step = env.step(action_step.action)
            total += float(time_step.reward)
    return total / episodes


def _dqn(args, train_step, collect_env, server_address, local_server):
    """TF-Agents' DQN example: a uniform table of 2-step items, one collect step and one batch per iteration.

    Returns the greedy policy, the observer, and the function running one iteration."""
    import tensorflow as tf
    from tf_agents.agents.dqn import dqn_agent
    from tf_agents.networks import sequential
    from tf_agents.policies import py_tf_eager_policy, random_py_policy
    from tf_agents.replay_buffers import reverb_replay_buffer, reverb_utils
    from tf_agents.specs import tensor_spec
    from tf_agents.train import actor, learner, triggers
    from tf_agents.utils import common

    time_step_spec = tensor_spec.from_spec(collect_env.time_step_spec())
    action_spec = tensor_spec.from_spec(collect_env.action_spec())
    num_actions = int(action_spec.maximum - action_spec.minimum + 1)
    q_network = sequential.Sequential([
        tf.keras.layers.Dense(64, activation="relu", kernel_initializer=tf.keras.initializers.VarianceScaling(
            scale=2.0, mode="fan_in", distribution="truncated_normal")),
        tf.keras.layers.Dense(num_actions, kernel_initializer=tf.keras.initializers.RandomUniform(-0.03, 0.03),
                              bias_initializer=tf.keras.initializers.Constant(-0.2)),
    ])
    agent = dqn_agent.DqnAgent(
        time_step_spec, action_spec, q_network=q_network, epsilon_greedy=0.1, target_update_tau=0.05,
        target_update_period=5, gamma=0.99, optimizer=tf.keras.optimizers.Adam(learning_rate=args.learning_rate),
        td_errors_loss_fn=common.element_wise_squared_loss, train_step_counter=train_step)
    agent.initialize()

    # In-process: TF-Agents' `local_server` argument; remote: its `server_address` (a gRPC client).
    replay = reverb_replay_buffer.ReverbReplayBuffer(
        agent.collect_data_spec, sequence_length=2, table_name=DQN_TABLE, local_server=local_server,
        server_address=server_address)
    observer = reverb_utils.ReverbAddTrajectoryObserver(replay.py_client, DQN_TABLE, sequence_length=2,
                                                         stride_length=1)
    dataset = replay.as_dataset(num_parallel_calls=2, sample_batch_size=64, num_steps=2).prefetch(2)
    checkpoint_trigger = triggers.ReverbCheckpointTrigger(train_step, args.checkpoint_interval, replay.py_client)
    dqn_learner = learner.Learner(os.path.join(args.root_dir, "learner"), train_step, agent, lambda: dataset,
                                  triggers=[checkpoint_trigger])

    random_policy = random_py_policy.RandomPyPolicy(collect_env.time_step_spec(), collect_env.action_spec(),
                                                    seed=args.seed)
    actor.Actor(collect_env, random_policy, train_step, steps_per_run=args.initial_collect_steps,
                observers=[observer]).run()
    collect_policy = py_tf_eager_policy.PyTFEagerPolicy(agent.collect_policy, use_tf_function=True)
    collect_actor = actor.Actor(collect_env, collect_policy, train_step, steps_per_run=1, observers=[observer])

    def iteration():
        collect_actor.run()
        dqn_learner.run(iterations=1)

    return py_tf_eager_policy.PyTFEagerPolicy(agent.policy, use_tf_function=True), observer, iteration


def _ppo(args, train_step, collect_env, server_address, local_server):
    """TF-Agents' PPO example (`examples/ppo/schulman17`): each iteration collects one fixed-length sequence
    into two FIFO tables sampled once (training and normalization), trains `ppo_epochs` epochs on it with
    `PPOLearner`, and clears both tables. Returns what `_dqn` returns."""
    import tensorflow as tf
    from tf_agents.agents.ppo import ppo_clip_agent
    from tf_agents.networks import actor_distribution_network, value_network
    from tf_agents.policies import py_tf_eager_policy
    from tf_agents.replay_buffers import reverb_replay_buffer, reverb_utils
    from tf_agents.train import actor, ppo_learner, triggers
    from tf_agents.train.utils import spec_utils

    observation_spec, action_spec, time_step_spec = spec_utils.get_tensor_specs(collect_env)
    agent = ppo_clip_agent.PPOClipAgent(
        time_step_spec, action_spec, optimizer=tf.keras.optimizers.Adam(learning_rate=args.learning_rate),
        actor_net=actor_distribution_network.ActorDistributionNetwork(observation_spec, action_spec,
                                                                      fc_layer_params=(64,)),
        value_net=value_network.ValueNetwork(observation_spec, fc_layer_params=(64,)),
        importance_ratio_clipping=0.2, lambda_value=0.95, discount_factor=0.99, entropy_regularization=0.0,
        num_epochs=1, use_gae=True, use_td_lambda_return=True, normalize_observations=True,
        compute_value_and_advantage_in_train=False, update_normalizers_in_train=False,
        train_step_counter=train_step)
    agent.initialize()

    address = server_address or f"localhost:{local_server.port}"
    length = args.ppo_sequence_length
    buffers = [reverb_replay_buffer.ReverbReplayBuffer(agent.collect_data_spec, sequence_length=length,
                                                       table_name=name, server_address=address,
                                                       max_cycle_length=1, rate_limiter_timeout_ms=1000)
               for name in PPO_TABLES]

    class FixedLengthObserver(reverb_utils.ReverbAddTrajectoryObserver):
        """Writes every step, so that a sequence may span episodes (the PPO example's observer)."""

        def __call__(self, trajectory):
            self._writer.append(trajectory)
            self._cached_steps += 1
            self._write_cached_steps()

    observer = FixedLengthObserver(buffers[0].py_client, list(PPO_TABLES), sequence_length=length,
                                   stride_length=length)
    checkpoint_trigger = triggers.ReverbCheckpointTrigger(train_step, args.checkpoint_interval,
                                                          buffers[0].py_client)
    training, normalization = [
        lambda b=b: b.as_dataset(sample_batch_size=1, sequence_preprocess_fn=agent.preprocess_sequence)
        for b in buffers]
    agent_learner = ppo_learner.PPOLearner(
        os.path.join(args.root_dir, "learner"), train_step, agent, experience_dataset_fn=training,
        normalization_dataset_fn=normalization, num_samples=1, num_epochs=args.ppo_epochs, minibatch_size=64,
        shuffle_buffer_size=length, triggers=[checkpoint_trigger])
    collect_policy = py_tf_eager_policy.PyTFEagerPolicy(agent.collect_policy, use_tf_function=True)
    collect_actor = actor.Actor(collect_env, collect_policy, train_step, steps_per_run=length,
                                observers=[observer])

    def iteration():
        collect_actor.run()
        observer.reset(write_cached_steps=False)
        agent_learner.run()
        for b in buffers:
            b.clear()

    return py_tf_eager_policy.PyTFEagerPolicy(agent.policy, use_tf_function=True), observer, iteration


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agent", choices=("dqn", "ppo"), required=True)
    parser.add_argument("--server-address", default=None, help="HOST:PORT of a running server")
    parser.add_argument("--root-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--iterations", type=int, required=True,
                        help="DQN: collect/train steps; PPO: collect/train iterations")
    parser.add_argument("--initial-collect-steps", type=int, default=500, help="DQN: random steps first")
    parser.add_argument("--checkpoint-interval", type=int, default=100, help="train steps between checkpoints")
    parser.add_argument("--ppo-sequence-length", type=int, default=500)
    parser.add_argument("--ppo-epochs", type=int, default=4)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf_agents is written for Keras 2 (tf-keras)
    import numpy as np
    import tensorflow as tf

    import replay_tf
    replay_tf.register_as_reverb()  # before TF-Agents' lazy `reverb` import resolves
    import reverb
    from tf_agents.environments import suite_gym
    from tf_agents.train.utils import train_utils

    random.seed(args.seed)
    np.random.seed(args.seed)
    tf.random.set_seed(args.seed)
    collect_env = suite_gym.load(ENV_NAME)
    collect_env.seed(args.seed)
    eval_env = suite_gym.load(ENV_NAME)
    # int64, as TF-Agents' train_utils makes it: TF 2.21's summary writer rejects an int32 step variable.
    train_step = train_utils.create_train_step()

    local_server = None
    checkpoint_dir = os.path.join(args.root_dir, "reverb_checkpoints")
    if args.server_address is None:
        local_server = reverb.Server(_tables(reverb, args.agent), port=None,
                                     checkpointer=reverb.checkpointers.DefaultCheckpointer(checkpoint_dir))
    build = _dqn if args.agent == "dqn" else _ppo
    greedy, observer, iteration = build(args, train_step, collect_env, args.server_address, local_server)

    def evaluate():
        return _average_return(eval_env, greedy, args.eval_episodes, args.seed + 1)

    return_before = evaluate()
    curve = []
    evaluate_every = 1 if args.agent == "ppo" else max(1, args.iterations // 5)
    for i in range(args.iterations):
        iteration()
        if (i + 1) % evaluate_every == 0:
            curve.append((int(train_step.numpy()), evaluate()))
            print(f"train step {curve[-1][0]}: average return {curve[-1][1]:.1f}", flush=True)
    observer.close()
    info = reverb.Client(args.server_address or f"localhost:{local_server.port}").server_info()
    result = {
        "return_before": return_before,
        "curve": curve,
        "train_steps": int(train_step.numpy()),
        # Items each table accepted (PPO's tables are reset after every iteration, which zeroes this).
        "inserts": {name: int(table.rate_limiter_info.insert_stats.completed) for name, table in info.items()},
        "reverb_file": reverb.__file__,
    }
    if local_server is not None:
        result["checkpoints"] = sorted(os.listdir(checkpoint_dir)) if os.path.isdir(checkpoint_dir) else []
        local_server.stop()
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
