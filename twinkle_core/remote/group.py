"""A remote group: one Ray actor per rank of a device mesh, in one placement group.

The group starts its actors, gives each the environment torchrun would (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR/PORT), has them join torch.distributed together, and then runs calls on
all of them at once. A call waits on every rank with `ray.wait`, so a rank that dies is noticed as
soon as Ray reports it: the call raises `RemoteRankError` naming the rank, and the group is torn
down (its surviving ranks would otherwise wait forever inside a collective with the dead one).
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from typing import Any

from twinkle_core.remote.actor import RankActor, forwarded_env
from twinkle_core.remote.context import GroupResources

logger = logging.getLogger(__name__)

SETUP_TIMEOUT_S = 300.0  # placement, actor start and the torch.distributed rendezvous
ERROR_GRACE_S = 10.0  # after one rank raised, how long the others get to finish the same call
COLLECTIVE_TIMEOUT_S = 1800.0


class RemoteRankError(RuntimeError):
    """A rank of a remote group died, or a call on it timed out; the group cannot be used again."""

    def __init__(self, group: str, rank: int | None, message: str) -> None:
        where = f"rank {rank} of remote group {group!r}" if rank is not None else f"remote group {group!r}"
        super().__init__(f"{where}: {message}")
        self.group = group
        self.rank = rank


class RankGroup:
    def __init__(
        self,
        name: str,
        device_mesh: Any,
        resources: GroupResources,
        seed: int | None = None,
        call_timeout_s: float | None = None,
    ) -> None:
        self.name = name
        self.device_mesh = device_mesh
        self.world_size = int(device_mesh.world_size)
        self.resources = resources
        self.call_timeout_s = call_timeout_s
        self.failure: RemoteRankError | None = None
        self.actors: list[Any] = []
        self.pids: list[int] = []
        self._placement_group: Any = None
        try:
            self._start(seed)
        except BaseException:
            self.stop()  # no half-started group keeps actors or reserved resources
            raise

    # -- start ------------------------------------------------------------------------------------

    def _bundle(self) -> dict[str, float]:
        import ray

        gpus = self.resources.num_gpus
        if gpus is None:
            gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        bundle = {"CPU": self.resources.num_cpus}
        if gpus:
            bundle["GPU"] = gpus
        return bundle

    def _start(self, seed: int | None) -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self._bundle()
        pg = placement_group([dict(bundle) for _ in range(self.world_size)], strategy="PACK")
        try:
            ray.get(pg.ready(), timeout=SETUP_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
            raise ValueError(
                f"remote group {self.name!r}: the Ray cluster cannot place {self.world_size} ranks of "
                f"{bundle} each (available: {ray.available_resources()}); lower groups={{...}} resources "
                "in initialize() or the device mesh size"
            ) from None
        self._placement_group = pg
        actor_cls = ray.remote(RankActor)
        for rank in range(self.world_size):
            options: dict[str, Any] = {
                "num_cpus": bundle["CPU"],
                "num_gpus": bundle.get("GPU", 0),
                "max_restarts": 0,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=rank
                ),
            }
            self.actors.append(actor_cls.options(**options).remote())
        infos = self.run("start", [actor.node_info.remote() for actor in self.actors], SETUP_TIMEOUT_S)
        self.pids = [int(info["pid"]) for info in infos]
        master_port = self.run("start", [self.actors[0].free_port.remote()], SETUP_TIMEOUT_S)[0]
        envs = self._rank_envs(infos, str(infos[0]["ip"]), int(master_port), bundle)
        self.run(
            "torch.distributed setup",
            [
                actor.setup.remote(env, seed, COLLECTIVE_TIMEOUT_S)
                for actor, env in zip(self.actors, envs, strict=True)
            ],
            SETUP_TIMEOUT_S,
        )
        logger.info("remote group %r: %d ranks ready (%s each)", self.name, self.world_size, bundle)

    def _rank_envs(
        self, infos: list[dict[str, Any]], master_addr: str, master_port: int, bundle: dict[str, float]
    ) -> list[dict[str, str]]:
        ranks_by_node: dict[str, list[int]] = defaultdict(list)
        for rank, info in enumerate(infos):
            ranks_by_node[info["node_id"]].append(rank)
        base = forwarded_env(dict(os.environ))
        base["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", str(max(int(bundle["CPU"]), 1)))
        envs = []
        for rank, info in enumerate(infos):
            node_ranks = ranks_by_node[info["node_id"]]
            env = {
                **base,
                "RANK": str(rank),
                "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(node_ranks.index(rank)),
                "LOCAL_WORLD_SIZE": str(len(node_ranks)),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "TWINKLE_REMOTE_GROUP": self.name,
            }
            # Ray shows each actor only its own GPU; the ranks of a node see all of the group's GPUs
            # of that node instead, in local-rank order, so cuda:LOCAL_RANK is the rank's own GPU
            # and NCCL can use peer-to-peer between them (torchrun's view).
            node_gpus = [gpu for r in node_ranks for gpu in infos[r]["gpu_ids"]]
            if node_gpus and len(node_gpus) == len(node_ranks):
                env["CUDA_VISIBLE_DEVICES"] = ",".join(node_gpus)
            elif node_gpus:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(info["gpu_ids"])
                env["LOCAL_RANK"] = "0"
            envs.append(env)
        return envs

    # -- calls ------------------------------------------------------------------------------------

    def check_usable(self) -> None:
        if self.failure is not None:
            raise RemoteRankError(self.name, self.failure.rank, f"the group is stopped after: {self.failure}")

    def run(self, what: str, refs: list[Any], timeout_s: float | None = None) -> list[Any]:
        """Wait for one result per rank (refs[i] runs on rank i); raise on the first failure."""
        import ray
        from ray.exceptions import RayActorError

        self.check_usable()
        timeout_s = timeout_s if timeout_s is not None else self.call_timeout_s
        deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        first_error: tuple[int, BaseException] | None = None
        while pending:
            wait_s = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
            if not ready:
                if first_error is not None:
                    break  # the other ranks are stuck where the failed one left them
                stuck = sorted(pending.values())
                raise self._fail(stuck[0], f"{what} did not finish within {timeout_s:.0f} s on ranks {stuck}")
            ref = ready[0]
            rank = pending.pop(ref)
            try:
                results[rank] = ray.get(ref)
            except RayActorError as exc:
                pid = self.pids[rank] if rank < len(self.pids) else "?"
                raise self._fail(rank, f"its actor (pid {pid}) died during {what}: {exc}") from exc
            except Exception as exc:
                if first_error is None:
                    first_error = (rank, exc)
                    grace_end = time.monotonic() + ERROR_GRACE_S
                    deadline = grace_end if deadline is None else min(deadline, grace_end)
        if first_error is not None:
            error_rank, error = first_error
            if pending:
                hung = sorted(pending.values())
                self._fail(error_rank, f"{what} raised on rank {error_rank} while ranks {hung} hung")
            error.add_note(f"raised by rank {error_rank} of remote group {self.name!r} during {what}")
            raise error
        return results

    def _fail(self, rank: int, message: str) -> RemoteRankError:
        error = RemoteRankError(self.name, rank, message)
        logger.error("%s; stopping the group", error)
        self.stop()
        self.failure = error
        return error

    def construct(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        self.check_usable()
        refs = [actor.construct.remote(cls, args, kwargs) for actor in self.actors]
        ids = self.run(f"{cls.__name__}()", refs)
        assert len(set(ids)) == 1, f"ranks disagree on the object id: {ids}"
        return int(ids[0])

    def call(
        self, object_id: int, method: str, per_rank: list[tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> list[Any]:
        self.check_usable()
        refs = [
            actor.call.remote(object_id, method, args, kwargs)
            for actor, (args, kwargs) in zip(self.actors, per_rank, strict=True)
        ]
        return self.run(method, refs)

    def get_attribute(self, object_id: int, name: str, all_ranks: bool) -> list[Any]:
        self.check_usable()
        actors = self.actors if all_ranks else self.actors[:1]
        return self.run(name, [actor.get_attribute.remote(object_id, name) for actor in actors])

    def release(self, object_id: int) -> None:
        if self.failure is None:
            self.run("release", [actor.release.remote(object_id) for actor in self.actors])

    def stop(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:  # already gone: nothing left to stop
                logger.debug("remote group %r: kill: %s", self.name, exc)
        self.actors = []
        if self._placement_group is not None:
            try:
                remove_placement_group(self._placement_group)
            except Exception as exc:
                logger.debug("remote group %r: remove placement group: %s", self.name, exc)
            self._placement_group = None
        if self.failure is None:
            self.failure = RemoteRankError(self.name, None, "stopped")
