"""The anchor of `vla_simulators.py`: LeRobot's own ACT policy (lerobot 0.4.4, arXiv:2304.13705) trained on the very
demonstration folder oxRL clones, for a wall-clock budget on this machine, then scored greedily on the same held-out
initial states of the same simulator (oxRL's `make_env`, so the same reset seeds, frames, state and success).

lerobot pins torch < 2.11 and a CUDA torchvision, so it lives in a virtual environment of its own (about 8.5 GB, 6
minutes to install; oxRL's set-up keeps the CPU torch 2.13), with the simulators oxRL's `vla` extra installs:

    python3.11 -m venv ~/.cache/oxrl/venv-lerobot
    ~/.cache/oxrl/venv-lerobot/bin/pip install 'lerobot[pusht]==0.4.4' 'panda-gym>=3.0.7'
    ~/.cache/oxrl/venv-lerobot/bin/python benchmarks/lerobot_anchor.py --demos runs/vla-pusht/demos --env pusht \\
        --seconds 600 --seeds 1000000 1000001 --max-steps 152

`vla_simulators.py --lerobot-python ~/.cache/oxrl/venv-lerobot/bin/python` runs it after behaviour cloning, with that
stage's own training time as the budget. ACT keeps LeRobot's defaults (its AdamW preset, lr 1e-5, a ResNet-18
backbone) but for three things this machine imposes or the comparison needs: the backbone starts random (no hub for
ImageNet weights, as oxRL's policy starts random), the device is the CPU, and the chunk is oxRL's (`--chunk`, all of
it executed). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))  # the simulator as oxRL makes it (oxrl.vla.envs), benchmarks.common


def train(demos: Path, chunk: int, seconds: float, batch_size: int, seed: int, state: bool = True):
    """ACT trained on `demos` until `seconds` have passed: the policy, its pre/post-processors, the steps taken.
    `state=False`: the policy sees the cameras alone (the demonstrations' `observation.state` is not an input)."""
    import torch
    from lerobot.configs.types import FeatureType
    from lerobot.datasets.lerobot_dataset import LeRobotDataset, LeRobotDatasetMetadata
    from lerobot.datasets.utils import dataset_to_policy_features
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    torch.manual_seed(seed)
    meta = LeRobotDatasetMetadata("local/demos", root=demos)
    features = dataset_to_policy_features(meta.features)
    outputs = {key: feature for key, feature in features.items() if feature.type is FeatureType.ACTION}
    inputs = {key: feature for key, feature in features.items()
              if key not in outputs and (state or feature.type is not FeatureType.STATE)}
    config = ACTConfig(input_features=inputs, output_features=outputs, chunk_size=chunk, n_action_steps=chunk,
                       pretrained_backbone_weights=None, device="cpu")
    policy = ACTPolicy(config)
    preprocess, postprocess = make_pre_post_processors(config, dataset_stats=meta.stats)
    dataset = LeRobotDataset("local/demos", root=demos,
                             delta_timestamps={"action": [k / meta.fps for k in range(chunk)]})
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(seed))
    preset = config.get_optimizer_preset()
    optimizer = preset.build(policy.get_optim_params())
    policy.train()
    started, steps, losses = time.perf_counter(), 0, []
    while time.perf_counter() - started < seconds:
        for batch in loader:
            loss, _ = policy.forward(preprocess(batch))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), preset.grad_clip_norm)
            optimizer.step()
            optimizer.zero_grad()
            steps, losses = steps + 1, [*losses[-49:], loss.item()]
            if time.perf_counter() - started >= seconds:
                break
    policy.eval()
    return policy, preprocess, postprocess, meta.camera_keys, steps, sum(losses) / max(len(losses), 1)


def reads_state(policy) -> bool:
    """Whether the trained ACT takes the proprioceptive state as an input (not with --no-state, nor without one)."""
    return policy.config.robot_state_feature is not None


def evaluate(policy, preprocess, postprocess, cameras: list[str], env_name: str, env_kwargs: dict, seeds: list[int],
             max_steps: int) -> dict:
    """Greedy episodes from each held-out seed: the mean of each episode's best reward (PushT: LeRobot's coverage
    score) and the success rate, as `oxrl eval` scores oxRL's policy."""
    import numpy as np
    import torch

    from benchmarks.common import score_episodes
    from oxrl.vla.envs import make_env

    state = reads_state(policy)

    def act(task: str):
        policy.reset()  # a new episode: ACT's queue of actions still to execute empties

        def action(observation, info) -> np.ndarray:
            batch = {key: torch.from_numpy(np.array(image)).permute(2, 0, 1).float()[None] / 255
                     for key, image in zip(cameras, observation.images, strict=True)}
            if observation.state is not None:  # without the state as an input, ACT's inference still reads the
                # tensor's device (lerobot 0.4.4): it gets zeros, which nothing else reads
                values = observation.state if state else np.zeros_like(observation.state)
                batch["observation.state"] = torch.tensor(values, dtype=torch.float32)[None]
            with torch.no_grad():
                action = postprocess(policy.select_action(preprocess({**batch, "task": [task]})))
            return action[0].numpy().astype(np.float64)

        return action

    env = make_env(env_name, env_kwargs)
    try:
        return score_episodes(env, seeds, act, max_steps)
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demos", type=Path, required=True, help="a LeRobot dataset folder (oxrl demos' output)")
    parser.add_argument("--env", required=True, help="the simulator, as vla.env names it (pusht, panda-push)")
    parser.add_argument("--env-kwargs", type=json.loads, default={}, help="vla.env_kwargs as JSON")
    parser.add_argument("--seconds", type=float, required=True, help="the training budget, wall-clock")
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="held-out reset seeds")
    parser.add_argument("--max-steps", type=int, required=True, help="actions an episode at most")
    parser.add_argument("--chunk", type=int, default=4, help="actions a chunk, all executed (oxRL's vla.chunk)")
    parser.add_argument("--batch-size", type=int, default=8, help="LeRobot's default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-state", action="store_true",
                        help="the cameras alone: whether the policy needs the state (a diagnostic)")
    args = parser.parse_args()

    started = time.perf_counter()
    policy, preprocess, postprocess, cameras, steps, loss = train(args.demos, args.chunk, args.seconds,
                                                                  args.batch_size, args.seed, not args.no_state)
    trained = time.perf_counter() - started
    result = evaluate(policy, preprocess, postprocess, cameras, args.env, args.env_kwargs, args.seeds, args.max_steps)
    print(json.dumps({"stage": "lerobot_act", **result, "state": reads_state(policy),
                      "train_seconds": round(trained, 1), "steps": steps, "final_loss": round(loss, 4),
                      "eval_seconds": round(time.perf_counter() - started - trained, 1)}))


if __name__ == "__main__":
    main()
