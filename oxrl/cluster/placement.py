"""Resources of a `run.launcher: ray` run: what each worker group needs, checked against the cluster before
anything starts, and placement groups that are ready within `ray.placement_timeout_s` or an error naming the
group and what is missing (never a placement group pending forever).

    disaggregated   trainers: N bundles {CPU, GPU, custom}; rollout: M bundles; reward: K bundles (CPU, custom)
    colocated       bundle i holds trainer i and rollout worker i (i < M); a GPU there is shared, half each

A group's custom resources (`ray.<group>.resources`, e.g. {trainer_node: 1}) are in each of its bundles: Ray
places the bundle only on a node started with them, which is how a group is pinned to chosen nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from oxrl.config.schema import RayConfig, WorkerGroupConfig
from oxrl.errors import UserError


class PlacementError(UserError, RuntimeError):
    """The cluster cannot provide what a worker group asks for."""


@dataclass(frozen=True)
class Placement:
    """Where a group's workers go: its bundles, and each worker's bundle index and own resources."""

    group: str  # "trainers", "rollout", "reward"
    bundles: list[dict[str, float]]
    workers: list[tuple[int, float, float]]  # (bundle index, cpus, gpus) per worker


def _bundle(group: WorkerGroupConfig) -> dict[str, float]:
    return {**{key: value for key, value in (("CPU", group.cpus), ("GPU", group.gpus)) if value > 0}, **group.resources}


def placements(ray_cfg: RayConfig) -> list[Placement]:
    """The placement groups of a layout (pure: the config alone decides them)."""
    t, r, k = ray_cfg.trainers, ray_cfg.rollout, ray_cfg.reward
    for name, group in (("trainers", t), ("rollout", r), ("reward", k)):
        if group.count and not _bundle(group) and not (name == "rollout" and ray_cfg.layout == "colocated"):
            raise PlacementError(f"ray.{name}: each worker must reserve some CPUs or GPUs (cpus and gpus are both 0)")
    out = []
    if ray_cfg.layout == "colocated":
        bundles, trainers, rollout = [], [], []
        for i in range(t.count):
            shares = i < r.count
            gpus = max(t.gpus, r.gpus if shares else 0.0)
            custom = dict(t.resources)  # a shared bundle is pinned where both groups' resources are
            for key, value in (r.resources.items() if shares else ()):
                custom[key] = max(value, custom.get(key, 0.0))
            bundles.append({**{key: value for key, value in (("CPU", t.cpus + (r.cpus if shares else 0.0)), ("GPU", gpus))
                               if value > 0}, **custom})
            trainers.append((i, t.cpus, gpus / 2 if shares else gpus))
            if shares:
                rollout.append((i, r.cpus, gpus / 2))
        out += [Placement("trainers", bundles, trainers), Placement("rollout", [], rollout)]
    else:
        out += [Placement("trainers", [_bundle(t)] * t.count, [(i, t.cpus, t.gpus) for i in range(t.count)]),
                Placement("rollout", [_bundle(r)] * r.count, [(i, r.cpus, r.gpus) for i in range(r.count)])]
    if k.count:
        out.append(Placement("reward", [_bundle(k)] * k.count, [(i, k.cpus, k.gpus) for i in range(k.count)]))
    return out


def check_fits(groups: list[Placement], nodes: list[dict[str, float]]) -> None:
    """PlacementError when the cluster's nodes (their total resources) cannot hold the groups: a bundle larger
    than every node, or more of a resource in all than the cluster has."""
    totals: dict[str, float] = {}
    for node in nodes:
        for key, value in node.items():
            totals[key] = totals.get(key, 0.0) + value
    wanted: dict[str, float] = {}
    for placement in groups:
        for i, bundle in enumerate(placement.bundles):
            for key, value in bundle.items():
                wanted[key] = wanted.get(key, 0.0) + value
                largest = max((node.get(key, 0.0) for node in nodes), default=0.0)
                if value > largest:
                    raise PlacementError(
                        f"worker group `{placement.group}`: a worker needs {value:g} {key} on one node, and the largest "
                        f"node of the cluster has {largest:g}; lower ray.{placement.group}.{_field(key)} or add nodes")
    for key, value in wanted.items():
        if value > totals.get(key, 0.0):
            users = [p.group for p in groups if any(key in b for b in p.bundles)]
            raise PlacementError(f"the worker groups {users} need {value:g} {key} in all and the cluster has "
                                 f"{totals.get(key, 0.0):g}; lower their ray.<group>.count or .{_field(key)}")


def _field(resource: str) -> str:
    return {"CPU": "cpus", "GPU": "gpus"}.get(resource, f"resources.{resource}")


def reserve(placement: Placement, timeout_s: float):
    """The group's Ray placement group, ready; PlacementError naming the group after `timeout_s`."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group(placement.bundles, strategy="PACK", name=f"oxrl-{placement.group}")
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError as error:
        remove_placement_group(pg)
        raise PlacementError(
            f"worker group `{placement.group}` ({placement.bundles}) could not be placed within ray.placement_timeout_s "
            f"= {timeout_s:g}s; the cluster has {ray.available_resources()} free now") from error
    return pg
