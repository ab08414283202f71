"""Client runtimes on Ray actors (``--executor ray``; ``pip install -e ".[ray]"``).

Clients are grouped onto ``--ray-workers`` actors (default: one per CPU of the cluster), client
``k`` on actor ``k * W // K``: each Ray worker process costs ~300 MB just by importing torch, so
100 clients must not mean 100 processes.  Clients sharing an actor share a process (fine for
simulation, one trust domain anyway) and a dead actor drops all of its clients.

Only bytes cross: the driver hands an actor ``{client: request frame}`` and gets ``{client:
response frame}`` back (:mod:`.wire`); a client's runtime is built inside its actor from its
set-up frame and its state never leaves it except as its own checkpoint file.  (Ray pickles the
dict of bytes objects that carries the frames: its framing, not counted.)

A call waits at most ``--round-timeout`` seconds.  An actor that died (``RayActorError``, or
Ray's memory monitor killed its worker: ``OutOfMemoryError``) or did not answer in time (it is
then killed) loses its clients: they come back as lost and the
strategy makes them protocol dropouts (:mod:`.strategy`).  An error raised by client code is
re-raised in the driver, not treated as a dropout; a refusal (``ProtocolError``) is re-raised
after every actor has answered, the first in client order (:func:`.executor.answer_each` inside
each actor), so no other client misses a request of that stage.

``client_resources`` (``--ray-client-resources``) pins clients to the nodes declaring a custom
resource (:mod:`.placement`): their actors require it.

One Ray cluster is one trust domain: its members can run code in each other's workers and Ray
pickles task arguments (docs/runtime.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from ..config import ConfigError
from . import partition
from .executor import Executor, answer_each
from .memory import process_pss, release_freed_memory
from .placement import PIN, actor_plan


def _import_ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise ConfigError("--executor ray needs Ray: pip install -e '.[ray]' (or use --executor local)") from None
    return ray


class ClientHost:
    """The Ray actor: hosts a group of client runtimes and forwards frames to them."""

    def __init__(self, device: str = "cpu"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        self.device = device
        self.runtimes = {}

    def start(self, frames: dict[int, bytes]) -> list[int]:
        """Build the runtimes of this actor's clients; returns their ids."""
        from .client import ClientRuntime

        self.empty()
        for k in sorted(frames):
            self.runtimes[k] = ClientRuntime(frames.pop(k), self.device)
        partition.forget()  # pinned clients' shared load of the data (.partition)
        release_freed_memory()
        return sorted(self.runtimes)

    def call(self, method: str, requests: dict[int, bytes]) -> dict[int, bytes]:
        """Answer ``method`` for each addressed runtime of this actor."""
        try:
            return answer_each(self.runtimes, method, requests)
        finally:
            release_freed_memory(collect=False)

    def empty(self) -> None:
        """Drop the hosted runtimes and give their memory back (a run's end, or the next run's start)."""
        self.runtimes = {}
        release_freed_memory()

    def resources(self) -> dict:
        """The node this actor runs on and the resources Ray assigned it."""
        import ray

        ctx = ray.get_runtime_context()
        return {"node": ctx.get_node_id(), "resources": dict(ctx.get_assigned_resources())}

    def memory(self) -> dict:
        """This process's id, proportional set size and its parts (bytes, :func:`.memory.process_pss`)."""
        return {"pid": os.getpid(), "clients": len(self.runtimes), **(process_pss(os.getpid()) or {})}


#: idle ClientHost actors of this driver, reused by the next run on the same cluster (an actor costs
#: seconds to start: a fresh process importing torch); a dead one is dropped
_IDLE_HOSTS: list = []


class RayExecutor(Executor):
    """Client runtimes on ``workers`` Ray actors (module docstring)."""

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        num_cpus: int | None = None,
        workers: int | None = None,
        round_timeout: float = 600.0,
        device: str = "cpu",
        client_resources: dict[int, str] | None = None,
    ):
        super().__init__()
        ray = self.ray = _import_ray()
        self.started_cluster = False
        if not ray.is_initialized():
            if address:
                try:
                    ray.init(address=address, log_to_driver=False)
                except ConnectionError as exc:
                    raise ConfigError(
                        f"--ray-address {address}: no Ray cluster answers ({exc}). Start one with "
                        "`ray start --head` and pass the address it prints (its node IP, which "
                        "127.0.0.1 is not), or auto on the head machine"
                    ) from None
            else:
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
                self.started_cluster = True
        self.cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers_wanted = int(workers) if workers else self.cpus
        self.round_timeout, self.device, self.address = float(round_timeout), device, address
        self.pinned = dict(client_resources or {})
        missing = sorted(set(self.pinned.values()) - set(ray.cluster_resources()))
        if missing:
            raise ConfigError(
                f"--ray-client-resources: no node of the cluster declares {', '.join(missing)}; start "
                "the node holding those clients' data with ray start --resources "
                f"'{{\"{missing[0]}\": 1}}'"
            )
        self.actors: list = []
        self.actor_resources: list[str | None] = []  # the custom resource each actor requires
        self.placement: dict[int, int] = {}  # client -> actor index
        self.dead: dict[int, str] = {}  # actor index -> why

    def start(self, frames: Mapping[int, bytes]) -> None:
        """Start or reuse the actors (pinned as ``--ray-client-resources`` says) and build the runtimes on them."""
        ray = self.ray
        clients = sorted(frames)
        self.actor_resources, self.placement = actor_plan(clients, self.pinned, self.workers_wanted)
        cpu = min(1.0, self.cpus / len(self.actor_resources))
        self.actors = []
        while len(_IDLE_HOSTS) > self.actor_resources.count(None):  # surplus idle actors hold the CPUs
            ray.kill(_IDLE_HOSTS.pop(), no_restart=True)  # the pinned new ones need
        for resource in self.actor_resources:  # idle actors are reused where no resource is required
            if resource is None and _IDLE_HOSTS:
                self.actors.append(_IDLE_HOSTS.pop())
            else:
                options = {"resources": {resource: PIN}} if resource else {}
                self.actors.append(ray.remote(num_cpus=cpu, max_restarts=0, **options)(ClientHost).remote(self.device))
        refs = [
            a.start.remote({k: frames[k] for k in clients if self.placement[k] == j}) for j, a in enumerate(self.actors)
        ]
        ray.get(refs, timeout=self.round_timeout)

    def _call(self, method, requests):
        ray = self.ray
        lost = {k: self.dead[self.placement[k]] for k in requests if self.placement[k] in self.dead}
        groups: dict[int, dict[int, bytes]] = {}
        for k, req in requests.items():
            if k not in lost:
                groups.setdefault(self.placement[k], {})[k] = req
        refs = {self.actors[j].call.remote(method, sub): j for j, sub in groups.items()}
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=self.round_timeout) if refs else ([], [])
        responses: dict[int, bytes] = {}
        for ref in pending:
            j = refs[ref]
            ray.kill(self.actors[j], no_restart=True)
            self._lose(j, f"actor {j} gave no answer within --round-timeout {self.round_timeout:g} s", groups, lost)
        raised = []  # (client, error) of each actor whose client code raised
        for ref in ready:
            j = refs[ref]
            try:
                responses.update(ray.get(ref))
            except ray.exceptions.RayTaskError as e:  # client code raised: an error, not a dropout
                cause = e.cause if isinstance(e.cause, Exception) else e.as_instanceof_cause()
                raised.append((getattr(cause, "refusing_client", min(groups[j])), cause))
            except ray.exceptions.RayError as e:  # the actor died (crash, kill, Ray's OOM killer)
                self._lose(j, f"actor {j} died ({type(e).__name__})", groups, lost)
        if raised:  # every actor has answered: the first in client order
            raise min(raised, key=lambda r: r[0])[1] from None
        return responses, lost

    def _lose(self, j: int, why: str, groups: dict, lost: dict) -> None:
        self.dead[j] = why
        lost.update({k: why for k in groups.get(j, {})})

    def kill_actor_of(self, client: int) -> None:
        """Kill the actor hosting ``client`` (and its other clients): a crash, for tests.

        It returns once Ray reports it dead (``ray.kill`` is asynchronous).
        """
        actor = self.actors[self.placement[client]]
        self.ray.kill(actor, no_restart=True)
        try:
            while True:
                self.ray.get(actor.memory.remote(), timeout=self.round_timeout)
                time.sleep(0.05)
        except self.ray.exceptions.RayActorError:
            pass

    def resources(self) -> dict[int, dict]:
        """Client -> the node and resources of the actor hosting it (:meth:`ClientHost.resources`)."""
        got = self.ray.get([a.resources.remote() for a in self.actors], timeout=self.round_timeout)
        return {k: got[j] for k, j in self.placement.items()}

    def memory(self) -> list[dict]:
        """Memory of each live actor process (:meth:`ClientHost.memory`)."""
        live = [a for j, a in enumerate(self.actors) if j not in self.dead]
        return self.ray.get([a.memory.remote() for a in live], timeout=self.round_timeout)

    def describe(self) -> dict:
        """Workers, cluster CPUs, address, Ray version, pinned clients and dead actors."""
        return {
            "executor": self.name,
            "workers": len(self.actors),
            "cluster_cpus": self.cpus,
            "address": self.address or "local",
            "ray_version": self.ray.__version__,
            "client_resources": {str(k): r for k, r in sorted(self.pinned.items())},
            "dead_actors": {str(j): why for j, why in self.dead.items()},
        }

    def shutdown(self) -> None:
        """Kill the actors and the cluster this executor started.

        On a cluster it joined, keep the live actors, emptied of their runtimes (:meth:`ClientHost.empty`), for
        reuse.
        """
        for j, a in enumerate(self.actors):
            if self.started_cluster or j in self.dead or self.actor_resources[j] is not None:
                self.ray.kill(a, no_restart=True)
            else:
                a.empty.remote()  # an idle host holds no runtime, nor its memory
                _IDLE_HOSTS.append(a)
        self.actors = []
        if self.started_cluster:
            self.ray.shutdown()
