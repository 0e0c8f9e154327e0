"""One driver per output root and manifest name among the drivers of one Ray cluster: a named actor its driver owns.

A driver that joins a cluster others may join takes this lock before the storage lease (`farm.lease`). The lock
is an actor named for the resolved root and the manifest name, in the `farm` namespace, created by the driver that
holds it. Ray's GCS registers a name atomically, so of two drivers creating it only one can, and it ends the
actors a driver owns once that driver is gone (it exits, is SIGKILLed, or its node is lost), which frees the
name. Whether the holder lives is thus Ray's own view of its driver: no clock is compared and no storage touched,
so a driver that is frozen or cut off from the storage keeps its lock for as long as Ray counts it alive. The
actor runs on its driver's node, so no other node's loss ends it; it holds nothing but its owner's description.
Its holder watches it (`Held.keep`): an actor ended under a live driver (`ray kill`, Ray's memory monitor) stops
that driver's run, as a lost storage lease does, since another driver may now take the manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from farm import lease
from farm.errors import ClusterError

NAMESPACE = "farm"
ANSWER = 60.0  # seconds a holder's lock actor has to say whose it is (it starts on a node already running a driver)
WATCH = 5.0  # seconds between a holder's looks at its own lock, as the storage lease is touched


@ray.remote(num_cpus=0, max_restarts=0)
class _Lock:
    def __init__(self, owner: dict):
        self._owner = owner

    def owner(self) -> dict:
        return self._owner


def name(root: str | Path, manifest_name: str) -> str:
    """The lock's actor name: the manifest name for people, a hash of the resolved root for uniqueness."""
    digest = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:16]
    return f"lock:{manifest_name}:{digest}"


class Held:
    """A held lock; `keep(on_lost)` watches it while the run lasts, `release()` gives it back."""

    def __init__(self, actor: ray.actor.ActorHandle, actor_name: str):
        self._actor = actor
        self._name = actor_name
        self._stop = threading.Event()

    def keep(self, on_lost: Callable[[str], None]) -> None:
        threading.Thread(target=self._watch, args=(on_lost,), name="farm-cluster-lock", daemon=True).start()

    def _watch(self, on_lost: Callable[[str], None]) -> None:
        while not self._stop.wait(WATCH):
            try:
                ray.get(self._actor.owner.remote(), timeout=ANSWER)
            except ray.exceptions.GetTimeoutError:  # slow, not gone: Ray would have said so
                continue
            except ray.exceptions.RayActorError:
                if not self._stop.is_set():
                    on_lost(f"its cluster lock {self._name} (namespace {NAMESPACE}) was ended while the run held it "
                            f"(ray kill, or Ray's memory monitor); another driver may now take the manifest")
                return

    def release(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):  # already gone with its node: nothing is held
            ray.kill(self._actor, no_restart=True)


def acquire(path: Path, root: str | Path, manifest_name: str, owner: lease.Owner, *, wait: bool = False,
            on_wait: Callable[[lease.Owner, str], None] | None = None, poll: float = 1.0) -> Held:
    """Takes the lock of `root` and `manifest_name` on the connected cluster. Held by a driver Ray counts alive:
    LeaseHeld naming it (`path`, the storage lease's, names root and manifest as its refusal does), or with `wait`,
    waits until that driver releases it or is gone; `on_wait(holder, why)` says so once per holder.

    # Raises: LeaseHeld; ClusterError when the holder's lock does not answer within ANSWER seconds.
    """
    actor_name = name(root, manifest_name)
    lock = _Lock.options(name=actor_name, namespace=NAMESPACE, scheduling_strategy=(
        NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)))
    told = None
    while True:
        try:
            return Held(lock.remote(asdict(owner)), actor_name)
        except ValueError:  # the name is taken
            pass
        holder = _holder(actor_name)
        if holder is None:  # released meanwhile
            time.sleep(poll / 20)
            continue
        if not wait:
            raise lease.LeaseHeld(path, holder)
        if on_wait is not None and holder != told:
            on_wait(holder, "waiting for it to end (--wait)")
            told = holder
        time.sleep(poll)


def _holder(actor_name: str) -> lease.Owner | None:
    """The owner of the named lock; None when it has ended."""
    try:
        return lease.Owner(**ray.get(ray.get_actor(actor_name, namespace=NAMESPACE).owner.remote(), timeout=ANSWER))
    except ValueError:  # no actor of that name: released
        return None
    except ray.exceptions.RayActorError:  # ended after it was looked up
        return None
    except ray.exceptions.GetTimeoutError as err:
        raise ClusterError(f"the cluster's lock {actor_name} (namespace {NAMESPACE}) did not say whose it is in "
                           f"{ANSWER:g} s; is its node overloaded? `ray list actors` shows it") from err
