"""A site's resident ClientApp executor: the relay ClientApp run in the site process, no process per message.

By default a Flower SuperNode (``--isolation subprocess``) starts a ``flwr-clientapp`` process for
every message it receives: about a second of CPU to start Python and import Flower, per site and
stage.  With ``flower-supernode --isolation process --port P``, the SuperNode starts none and waits
for an executor to claim each task on its runtime API (``127.0.0.1:P``).  The site process
(:mod:`.flower_site` ``--clientappio 127.0.0.1:P``) is that executor: a thread that claims each
ClientApp task, pulls its message and context, runs the relay ClientApp
(:data:`.flower_app.clientapp`, the one installed with secure-fgl: the code in the run's FAB is
never executed), and pushes the reply and the task's status, as ``flwr-clientapp`` does for one
task.  The message's frames then reach the site's runtimes over its local socket as before.

This uses Flower's runtime API client (``flwr.supercore``), the one Flower's own ``flower-superexec``
and ``flwr-clientapp`` use; it follows ``flwr==1.42.*`` (the ``flower`` extra's pin).
"""

from __future__ import annotations

import threading
from logging import ERROR

#: how often an idle executor asks its SuperNode for a task (seconds)
POLL_INTERVAL = 0.25
#: a task's heartbeat period (seconds; Flower expects one within 30 s)
HEARTBEAT_INTERVAL = 10.0
#: how long one call to the SuperNode is retried while it is unreachable (seconds)
RETRY_TIME = 30.0


def _client(address: str, component: str, token: str | None = None, root_certificates: bytes | None = None):
    """A runtime API client of the SuperNode at ``address``.

    Transport errors are retried for at most :data:`RETRY_TIME` seconds, any other error raised (Flower's own
    retry policy would signal this process to stop on an expired token: the site must keep serving).
    """
    import httpx
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import RetryInvoker, exponential
    from flwr.supercore.runtime import RuntimeHttpClient

    interceptors: list = [RuntimeVersionHttpInterceptor(component_name=component)]
    if token is not None:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=root_certificates is None,
        root_certificates=root_certificates,
        interceptors=interceptors,
        retry_invoker=RetryInvoker(
            lambda: exponential(base_delay=0.1, max_delay=2), httpx.TransportError, max_tries=None, max_time=RETRY_TIME
        ),
    )


def _heartbeat(client, stop: threading.Event) -> None:
    """Tell the SuperNode every :data:`HEARTBEAT_INTERVAL` seconds that the task is alive, until ``stop``."""
    from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest  # type: ignore[attr-defined]

    while not stop.wait(HEARTBEAT_INTERVAL):
        try:
            client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
        except Exception:  # noqa: BLE001, S112 - a missed heartbeat only lets the SuperNode expire the task
            continue


def run_task(address: str, token: str, root_certificates: bytes | None = None) -> None:
    """Run one claimed ClientApp task in this process: pull, run the relay ClientApp, push reply and status."""
    from flwr.app import Message
    from flwr.app.error import Error
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore import log
    from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

    from .flower_app import clientapp

    client = _client(address, "flwr-clientapp", token, root_certificates)
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=(client, stop), daemon=True).start()
    message = reply = context = None
    status, details = SubStatus.FAILED, "ClientApp task failed"
    try:
        message, context, _, _ = pull_task_input(client)
        reply = clientapp(message=message, context=context)
        status, details = SubStatus.COMPLETED, ""
    except Exception as exc:  # noqa: BLE001 - reported to the ServerApp as the message's error, as Flower does
        log(ERROR, "the relay ClientApp raised an exception", exc_info=exc)
        details = f"{type(exc)}:<'{exc}'>"
        if message is not None:
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message)
    finally:
        stop.set()
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
            push_task_output(client=client, context=context, sub_status=status, details=details)
        finally:
            client.close()


def serve(
    address: str,
    stop: threading.Event,
    root_certificates: bytes | None = None,
    poll_interval: float = POLL_INTERVAL,
) -> None:
    """Claim and run this SuperNode's ClientApp tasks, one at a time, until ``stop`` is set.

    ``address``: the SuperNode's runtime API (its ``--host``/``--port``).  A failed claim or task
    is logged and the executor goes on.
    """
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # type: ignore[attr-defined]
    from flwr.supercore import log
    from flwr.supercore.constant import TaskType

    client = _client(address, "SuperExec", root_certificates=root_certificates)
    try:
        while not stop.is_set():
            try:
                claimed = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
                if claimed.HasField("task") and claimed.token:
                    run_task(address, claimed.token, root_certificates)
                    continue
            except Exception as exc:  # noqa: BLE001 - the executor outlives one failed task or claim
                log(ERROR, "the site's ClientApp executor: %s", exc)
            stop.wait(poll_interval)
    finally:
        client.close()


def start(address: str, root_certificates: bytes | None = None) -> threading.Event:
    """Serve ``address`` in a daemon thread; set the returned event to stop it."""
    stop = threading.Event()
    threading.Thread(
        target=serve, args=(address, stop, root_certificates), name="flower-clientapp-executor", daemon=True
    ).start()
    return stop
