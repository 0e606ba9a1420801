"""The trainer's side of the Ray worker groups: a RolloutEngine (oxrl/rollout/base.py) and a reward function
whose work is done by rollout and reward workers (oxrl/cluster/workers.py).

Every trainer rank calls them with the same arguments (each rank holds the whole step's prompts: the loop's
`shared_rollouts`); rank 0 alone talks to the workers and the result reaches every rank over the trainers'
group. A failure on rank 0 is sent to the others too, so no rank waits in a collective for one that left.

    generate      the prompts split into whole-prompt slices, one per rollout worker, each seeded by its first
                  prompt's position (SamplingParams.seed), so the same layout samples the same run to run;
                  `submit` starts it and returns at once, `collect` waits (pipelined RL samples ahead with them)
    sync_weights  policy_state_dict() (gathered from every rank, LoRA merged) -> broadcast in buckets to every
                  worker -> each worker's probe log-probs against the trainer's (WeightSyncError naming it)
    rewards       the completions split into slices scored by the reward workers at once (else on rank 0)

`ray.rollout_split: steps` (rl.max_staleness >= 1) gives each request whole to one worker instead, each worker in
a weight group of its own (`WeightGroup`): a sync only gathers and keeps the new version, which goes to a worker
just before it samples a request of that version, so a sync never waits for a worker busy with another step.

A rollout worker that dies is restarted by Ray (`ray.max_restarts`; on another node when its node was lost,
waiting up to `ray.node_wait_s` for one); the step's sampling is then retried after every worker has joined a new
weight group and received the current weights. Once its restarts are spent, or with `ray.max_restarts: 0`, the
run stops with an error naming the worker. Under `rl.max_staleness` >= 1 (requests `submit`ted ahead) rank 0 keeps
the weights of every version a request still in flight was submitted under: a request whose worker died is
sampled again from its own version's weights, broadcast to its group, and then (`prompts`) the current weights
go back. Which version a group holds is known on rank 0 alone: every decision on it is taken there.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import torch

from oxrl.cluster.interruptible import WEIGHTS_GROUP
from oxrl.cluster.weight_channel import (
    ROOT, GroupAddress, WeightChannel, channel_backend, free_port, node_address, specs_of,
)
from oxrl.cluster.workers import NoWeightsError
from oxrl.config.schema import RayConfig
from oxrl.data.types import VisionInputs
from oxrl.models.value_head import without_value_head
from oxrl.rewards.combine import RewardOutput
from oxrl.rollout.base import Completion, SamplingParams
from oxrl.rollout.probe import DEFAULT_TOLERANCE, WeightSyncError, probe_ids, trainer_probe_logprobs

logger = logging.getLogger(__name__)


# Why a request cannot be sampled again once its worker died: its version's weights were not kept (a request made
# with `generate`, whose weights a later sync replaced).
AHEAD_LOST = ("died while it sampled a request whose weights are no longer held; resume the run from its last "
              "checkpoint (run.resume=true), which holds the steps sampled before it")


class WorkerError(RuntimeError):
    """A rollout or reward worker failed, hung or died for good; the message names it."""


class _Resync(Exception):
    """A rollout worker was restarted: every worker needs a new weight group and the current weights."""


def slices(count: int, parts: int) -> list[range]:
    """`count` items in `parts` consecutive slices whose sizes differ by at most one (empty ones dropped)."""
    base, extra = divmod(count, parts)
    out, start = [], 0
    for part in range(parts):
        size = base + (part < extra)
        if size:
            out.append(range(start, start + size))
        start += size
    return out


@dataclass
class RemoteWorkers:
    """What the driver hands every trainer rank: the worker groups' actor handles and their settings."""

    rollout: list  # RolloutWorker actor handles
    reward: list  # RewardWorker actor handles (may be empty)
    settings: RayConfig
    keep_versions: bool = False  # rl.max_staleness >= 1: requests span syncs, so each sync's weights are kept for them

    def engine(self, model, tokenizer, strategy, dtype_name: str, tolerance: float | None) -> RayRolloutEngine:
        return RayRolloutEngine(self, model, tokenizer, strategy, dtype_name, tolerance)

    def rewards(self, local_reward_fn, strategy) -> RemoteReward:
        return RemoteReward(self, local_reward_fn, strategy)


def _ray():
    import ray

    return ray


def _from_rank0(strategy, work):
    """`work()` run on rank 0, its result (or its failure) shared with every rank."""
    value, error = None, None
    if strategy.is_main:
        try:
            value = work()
        except Exception as caught:  # shared below, then raised on rank 0 as it is
            error = caught
    if strategy.world_size > 1:
        value, message = strategy.world_objects((value, None if error is None else f"{type(error).__name__}: {error}"))[0]
        if error is None and message is not None:
            raise WorkerError(f"trainer rank 0 stopped: {message}")
    if error is not None:
        raise error
    return value


def _cause(error: Exception) -> Exception:
    """The exception a Ray task raised inside the worker (RayTaskError wraps it)."""
    return getattr(error, "cause", None) or error


def wait_back(worker, who: str, node_wait_s: float, deadline: float | None = None) -> None:
    """Until the worker answers `ready` (Ray may still be restarting it: its model loads again, on a replacement node
    when its node was lost), by `deadline` (time.monotonic(); default: ray.node_wait_s from now). `who` names it in
    the WorkerError of a worker not back in time, or one Ray could not restart."""
    ray = _ray()
    deadline = time.monotonic() + node_wait_s if deadline is None else deadline
    late = (f"{who} was not back within ray.node_wait_s = {node_wait_s:g}s of its restart (a lost node: no node with "
            "its resources joined in time)")
    while True:
        try:
            ray.get(worker.ready.remote(), timeout=max(1.0, deadline - time.monotonic()))
            return
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise WorkerError(late) from None
            time.sleep(0.5)
        except ray.exceptions.GetTimeoutError as error:
            raise WorkerError(late) from error
        except ray.exceptions.RayActorError as error:
            raise WorkerError(f"{who} died and Ray could not restart it: {error}") from error


@dataclass
class WeightGroup:
    """Rollout workers that hold one version of the weights together and take it in one broadcast: every worker
    under `ray.rollout_split: prompts`, each worker alone under `steps`."""

    members: list[int]  # indices into RemoteWorkers.rollout
    channel: WeightChannel | None = None
    held: int = 0  # the version its workers hold (0: none of the trainer's, or unknown after a restart); rank 0 only
    last_ticket: int = 0  # the request it was last given (`steps`: the least recently used of the idle ones goes next)


class RayRolloutEngine:
    def __init__(self, workers: RemoteWorkers, model, tokenizer, strategy, dtype_name: str, tolerance: float | None):
        self.workers, self.model, self.strategy = workers, model, strategy
        self.settings = workers.settings
        base = model.get_base_model() if hasattr(model, "peft_config") else model
        self.probe = probe_ids(base, tokenizer)
        self.tolerance = tolerance or DEFAULT_TOLERANCE[dtype_name]
        count = len(workers.rollout)
        # `steps`: a step goes whole to one worker, which takes its version's weights just before sampling it, so a
        # sync never waits for the workers still sampling other steps.
        self.by_steps = self.settings.rollout_split == "steps"
        self.groups = [WeightGroup([i]) for i in range(count)] if self.by_steps else [WeightGroup(list(range(count)))]
        self.generation = 0
        self.restarts = [0] * count
        self.synced = False
        self.syncs = 0  # weight syncs so far: version v is the weights of sync v
        self.gaps: list[float] = []  # probe gaps of the pushes since the last sync, reported by the next
        self.tickets = 0
        self.requests: dict[int, tuple] = {}  # ticket -> (prompts, params, vision, version), on every rank
        self.pending: dict[int, tuple[int, list[range], list]] = {}  # ticket -> (group, slices, Ray refs), on rank 0
        # Requests sampled ahead (rl.max_staleness >= 1): each sync's weights (rank 0; None elsewhere) and the trainer's
        # probe log-probs, kept while a request of that version is in flight (and, under `steps`, the current version
        # until it is pushed). One CPU copy of the policy per version.
        self.keep_versions = workers.keep_versions or self.by_steps
        self.kept: dict[int, tuple[dict[str, torch.Tensor] | None, torch.Tensor]] = {}
        self.counted: set = set()  # refs whose worker's death is counted in `restarts` already

    # ---- sampling ---------------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 vision: list[VisionInputs | None] | None = None) -> list[Completion]:
        return self.collect(self.submit(prompts, params, vision))

    def submit(self, prompts: list[list[int]], params: SamplingParams,
               vision: list[VisionInputs | None] | None = None) -> int:
        """Every rank: start the workers sampling (rank 0 holds the requests); returns the ticket for `collect`."""
        if not self.synced:  # the first call: workers get (and prove they hold) the trainer's weights
            self.sync_weights(self.model)
        vision = vision if vision is not None else [None] * len(prompts)
        self.tickets += 1
        ticket = self.tickets
        self.requests[ticket] = (prompts, params, vision, self.syncs)
        self._start(ticket)
        return ticket

    def collect(self, ticket: int) -> list[Completion]:
        """Every rank: the completions of a submitted request. A worker restarted meanwhile: its group gets the
        weights the request was submitted under again (the live ones, or the version kept for it), the request is
        sampled again, identically, and (`prompts`) the workers go back to the current weights."""
        _, _, vision, version = self.requests[ticket]
        while True:
            outcome = _from_rank0(self.strategy, lambda: self._results(ticket, vision))
            if outcome is not None:
                break
            # A worker was restarted: the request's weights go to its group again (`_start`), and it is sampled again
            # (interruptible: from the live weights, `_send`; its tokens only get fresher).
            if self.settings.interruptible:
                logger.warning("rollout request %d is sampled again from the live weights (version %d; it was submitted "
                               "under %d): under ray.interruptible its tokens only get fresher", ticket, self.syncs, version)
            elif version == self.syncs and version not in self.kept:
                self.sync_weights(self.model)  # the live weights are the request's: every rank takes part in the gather
                version = self.syncs
                self.requests[ticket] = (*self.requests[ticket][:3], version)
            elif version not in self.kept:
                raise WorkerError(f"a rollout worker {AHEAD_LOST}")
            elif version != self.syncs:
                logger.warning("rollout request %d (weights version %d, the current is %d) is sampled again from its "
                               "own version's weights, kept for it", ticket, version, self.syncs)
            self._start(ticket)
        del self.requests[ticket]
        if not self.by_steps:  # back to the current weights (what a group holds is known on rank 0 alone)
            _from_rank0(self.strategy, lambda: self.groups[0].held == self.syncs or self._push_version(0, self.syncs))
        self._forget_versions()
        return outcome

    def _forget_versions(self) -> None:
        """Only the current version and those of requests in flight stay kept (interruptible: the current one, which
        a lost request is sampled again from)."""
        needed = {self.syncs} | ({request[3] for request in self.requests.values()}
                                 if not self.settings.interruptible else set())
        for version in [v for v in self.kept if v not in needed]:
            del self.kept[version]
        self.counted &= {ref for _, ref in self._in_flight()}

    def _in_flight(self) -> list[tuple[int, object]]:
        """(worker index, Ray ref) of every request's slice in flight (rank 0)."""
        return [(self.groups[g].members[j], ref) for g, _, refs in self.pending.values() for j, ref in enumerate(refs)]

    def _start(self, ticket: int) -> None:
        """Every rank: rank 0 hands the request to a group, first pushing it the request's weights if it holds others
        (`steps`), and keeps the refs; a push's probe gap is reported by the next sync."""
        gap = _from_rank0(self.strategy, lambda: self._send(ticket))
        if gap is not None:
            self.gaps.append(gap)

    def _send(self, ticket: int) -> float | None:
        prompts, params, vision, version = self.requests[ticket]
        # `prompts`: the one group. `steps`: the group with the fewest requests in flight, the least recently used first.
        busy = [0] * len(self.groups)
        for g, _, _ in self.pending.values():
            busy[g] += 1
        g = min(range(len(self.groups)), key=lambda i: (busy[i], self.groups[i].last_ticket))
        group = self.groups[g]
        weights = self.syncs if self.settings.interruptible else version  # (interruptible: the live ones, `collect`)
        gap = self._push_version(g, weights) if group.held != weights else None
        parts = slices(len(prompts), len(group.members))
        refs = []
        for worker, part in zip(group.members, parts):
            seeded = replace(params, seed=None if params.seed is None else params.seed + part.start)
            refs.append(self.workers.rollout[worker].generate.remote([prompts[i] for i in part], seeded,
                                                                    [vision[i] for i in part], version))
        self.pending[ticket] = (g, parts, refs)
        group.last_ticket = ticket
        return gap

    def _results(self, ticket: int, vision: list[VisionInputs | None]) -> list[Completion] | None:
        g, parts, refs = self.pending.pop(ticket)
        try:
            results = self._get(refs, self.groups[g], self.settings.call_timeout_s, "sampling")
        except _Resync:
            return None
        out = []
        for part, completions in zip(parts, results):
            # A completion's images are the prompt's, here already: workers send them back empty.
            out.extend(replace(c, prompt_index=c.prompt_index + part.start, vision=vision[c.prompt_index + part.start])
                       for c in completions)
        return out

    def _get(self, refs: list, group: WeightGroup, timeout_s: float, what: str) -> list:
        """The result of each of the group's workers (`refs` in the order of its members); a dead worker restarted by
        Ray raises _Resync, one that cannot be, hangs or fails raises WorkerError naming it."""
        ray = _ray()
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if pending:
            late = [i for i, ref in zip(group.members, refs) if ref in pending]
            raise WorkerError(f"rollout worker(s) {late} did not finish {what} within ray.call_timeout_s = {timeout_s}s")
        results, died, failed = [], [], []
        for i, ref in zip(group.members, refs):
            try:
                results.append(ray.get(ref))
            # (a result held in a lost node's object store is lost with it: sampled again like a dead worker's)
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as error:
                died.append((i, ref, error))
            except ray.exceptions.RayTaskError as error:
                failed.append((i, _cause(error)))
        for i, ref, error in died:  # (the others' failures then are the broken group's, not their own)
            self._count_death(i, ref, error, what)
        restarted = [i for i, error in failed if isinstance(error, NoWeightsError)]  # restarted before this call
        if died or restarted:
            self._lost(group)
            raise _Resync()
        if failed:
            i, error = failed[0]
            raise WorkerError(f"rollout worker {i} failed during {what}: {type(error).__name__}: {error}") from error
        return results

    @staticmethod
    def _lost(group: WeightGroup) -> None:
        """A member died: the group forms again, and what it holds is unknown until the next push."""
        group.channel, group.held = None, 0

    def _count_death(self, i: int, ref, error: Exception, what: str) -> None:
        """A restart of worker i counted once per death (every request in flight on it died with it), within
        `ray.max_restarts`."""
        if ref in self.counted:
            return
        self.counted.update(other for worker, other in self._in_flight() if worker == i)
        self.counted.add(ref)
        if self.restarts[i] >= self.settings.max_restarts:
            raise WorkerError(f"rollout worker {i} died during {what} and its ray.max_restarts "
                              f"({self.settings.max_restarts}) restarts are spent: {error}") from error
        self.restarts[i] += 1
        logger.warning("rollout worker %d died during %s; Ray restarts it (restart %d of %d; on another node if its "
                       "node was lost) and what it was doing is done again, with the weights it was asked under", i, what,
                       self.restarts[i], self.settings.max_restarts)

    # ---- weights ----------------------------------------------------------------------------------

    def sync_weights(self, model) -> dict[str, float]:
        """Every rank: gather the policy's weights (rank 0 gets them) as the next version. `prompts`: rank 0 broadcasts
        them to every worker now and verifies them. `steps`: they are kept, and pushed to a worker with its next step."""
        started = time.perf_counter()
        state = self.strategy.policy_state_dict()
        trainer_probe = trainer_probe_logprobs(model, self.probe)  # sharded weights: a forward on every rank
        version = self.syncs + 1
        if self.keep_versions:  # requests submitted under it may have to be sampled again after a worker died
            self.kept[version] = (state, trainer_probe)
        if not self.by_steps:
            self.gaps.append(_from_rank0(self.strategy, lambda: self._push_state(0, version, state, trainer_probe)))
        self.synced = True
        self.syncs = version
        self._forget_versions()
        metrics = {"time/weight_sync": time.perf_counter() - started}
        if self.gaps:  # (`steps`: the pushes made as the steps since the last sync started)
            metrics["weight_sync/probe_gap"] = max(self.gaps)
        self.gaps = []
        return metrics

    def _push_version(self, g: int, version: int) -> float:
        """Rank 0: a kept version's weights to group g."""
        state, trainer_probe = self.kept[version]
        return self._push_state(g, version, state, trainer_probe)

    def _push_state(self, g: int, version: int, state: dict[str, torch.Tensor], trainer_probe: torch.Tensor) -> float:
        """Rank 0: `state` broadcast to group g and verified, again after a member's restart; the largest probe gap."""
        while (gap := self._push(self.groups[g], without_value_head(state), trainer_probe, version)) is None:
            pass
        self.groups[g].held = version
        return gap

    def _push(self, group: WeightGroup, state: dict[str, torch.Tensor], trainer_probe: torch.Tensor,
              version: int) -> float | None:
        """Broadcast to the group's workers and compare probes; None when a restarted worker needs the push again."""
        settings = self.settings
        self._note_deaths_ahead(group)
        specs = specs_of(state)
        bucket_bytes = int(settings.sync_bucket_mb * 2**20)
        # `ray.interruptible`: the workers take it beside the request they are sampling (oxrl/cluster/interruptible.py)
        beside = {"concurrency_group": WEIGHTS_GROUP} if settings.interruptible else {}
        try:
            self._connect(group)
            refs = [self.workers.rollout[i].receive_weights.options(**beside).remote(specs, bucket_bytes, self.probe,
                                                                                     version)
                    for i in group.members]
            try:
                group.channel.send(state, specs, bucket_bytes)
            except RuntimeError as error:  # a member left mid-broadcast: find out which below
                logger.warning("weight broadcast failed (%s); checking the rollout workers", error)
                group.channel = None
            probes = self._get(refs, group, settings.sync_timeout_s, "the weight sync")
        except _Resync:
            return None
        gaps = [float((trainer_probe - torch.tensor(p)).abs().mean()) for p in probes]
        for i, gap in zip(group.members, gaps):
            if not gap <= self.tolerance:
                raise WeightSyncError(
                    f"rollout worker {i}: its log-probs of the probe sequence differ from the trainer's by {gap:.3g} on "
                    f"average (tolerance {self.tolerance}): it is not sampling from the weights being trained")
        return max(gaps)

    def _note_deaths_ahead(self, group: WeightGroup) -> None:
        """A member that died under a request still in flight (a step sampled ahead, `rl.max_staleness`): its
        restart is counted and the group formed again before this push (the broadcast would wait for the dead
        member); `collect` samples the request again from its own version's weights."""
        ray = _ray()
        for worker, ref in self._in_flight():
            if worker not in group.members or ref not in ray.wait([ref], timeout=0)[0]:
                continue
            try:
                ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as error:
                self._count_death(worker, ref, error, "sampling a request ahead")
                self._lost(group)
            except ray.exceptions.RayTaskError:
                continue  # its own failure: `collect` reports it

    def _connect(self, group: WeightGroup) -> None:
        """A weight group of trainer rank 0 and the group's workers (a new generation after a restart)."""
        if group.channel is not None:
            return
        self.generation += 1
        timeout = self.settings.sync_timeout_s
        workers = [self.workers.rollout[i] for i in group.members]
        for i, worker in zip(group.members, workers):  # a restarted worker first: the group waits for every member
            wait_back(worker, f"rollout worker {i}", self.settings.node_wait_s)
        members = self._get([w.members.remote() for w in workers], group, timeout, "joining the weight group")
        address = GroupAddress(node_address(), free_port(), 1 + sum(members), self.generation, timeout, channel_backend())
        offsets = [1 + sum(members[:i]) for i in range(len(members))]  # rank 0 is ROOT, this trainer rank
        joined = [w.join.remote(address, offset) for w, offset in zip(workers, offsets)]
        group.channel = WeightChannel(address, ROOT)
        self._get(joined, group, timeout, "joining the weight group")

    def offload(self) -> None:
        """The workers free their memory themselves after each call (vLLM sleeps on GPU)."""

    def close(self) -> None:
        """The driver ends the workers with the run."""
        for group in self.groups:
            group.channel = None


class RemoteReward:
    """The run's reward function with the scoring done by the reward workers (rank 0 scores when there are none)."""

    def __init__(self, workers: RemoteWorkers, local_reward_fn, strategy):
        self.workers, self.local, self.strategy = workers, local_reward_fn, strategy

    def __call__(self, prompts, completions, fields=None, origins=None, completion_ids=None) -> RewardOutput:
        columns = (list(prompts), list(completions), list(fields) if fields is not None else [{} for _ in prompts],
                   list(origins) if origins is not None else None,
                   list(completion_ids) if completion_ids is not None else None)
        return _from_rank0(self.strategy, lambda: self._score(*columns))

    def _score(self, prompts, completions, fields, origins, completion_ids) -> RewardOutput:
        if not self.workers.reward:
            return self.local(prompts, completions, fields, origins, completion_ids)
        parts = slices(len(prompts), len(self.workers.reward))
        take = lambda column, part: None if column is None else [column[i] for i in part]  # noqa: E731
        calls = [lambda worker=worker, p=p: worker.score.remote(take(prompts, p), take(completions, p), take(fields, p),
                                                                take(origins, p), take(completion_ids, p))
                 for worker, p in zip(self.workers.reward, parts)]
        refs = [call() for call in calls]
        outputs = [self._scored(i, ref, call) for i, (ref, call) in enumerate(zip(refs, calls))]
        return RewardOutput.concat(outputs)

    def _scored(self, i: int, ref, call) -> RewardOutput:
        """Reward worker i's slice. While Ray brings back a worker whose node was lost (its actor is unavailable for a
        while), the slice is scored again once the worker answers, within ray.node_wait_s: a reward call holds no
        state. A worker dead for good, or one that hangs, is a WorkerError naming it."""
        ray, settings = _ray(), self.workers.settings
        deadline = time.monotonic() + settings.node_wait_s
        while True:
            if ray.wait([ref], timeout=settings.call_timeout_s)[1]:
                raise WorkerError(f"reward worker(s) [{i}] did not finish within ray.call_timeout_s = "
                                  f"{settings.call_timeout_s}s")
            try:
                return ray.get(ref)
            except ray.exceptions.RayTaskError as error:
                raise _cause(error) from error  # e.g. a reward's own error, with its row: as if scored here
            except ray.exceptions.ActorUnavailableError:  # restarting, e.g. on a replacement node
                logger.warning("reward worker %d is unavailable while Ray restarts it; its slice is scored again", i)
                wait_back(self.workers.reward[i], f"reward worker {i}", settings.node_wait_s, deadline)
                ref = call()
            except ray.exceptions.RayActorError as error:
                raise WorkerError(f"reward worker {i} died and its ray.max_restarts retries are spent: {error}") from error
