"""The Flower ``ServerApp`` and ``ClientApp`` of a secure-fgl run: two relays of bytes.

Neither app holds a party.  The **ClientApp** (one ``flwr-clientapp`` process per message, on
the site's machine) forwards the message's frame to its site's long-lived client process
(:mod:`.flower_site`) over the local socket named by the SuperNode's ``--node-config
'site-socket="..."'`` and returns that process's answer.  The **ServerApp** (launched by the
SuperLink for ``flwr run``) connects back to the secure-fgl driver (:mod:`.flower_executor`)
over the local socket named in the run config (``relay-socket``) and turns each of the driver's
calls into one Flower ``Message`` per addressed **site**: a site holding several clients gets
their frames in one message, so one ``flwr-clientapp`` process serves them all.  A message's
content is one ``ConfigRecord``: the method and timeout, and client ``k``'s frame as the ``bytes``
entry ``"frame/<k>"`` (unchanged); in the reply, each client's status (a JSON string) and answer.
Both apps import only Flower and the standard library: no per-message import of torch.

Relay operations (driver -> ServerApp, :mod:`.local_socket` messages): ``sites`` (find the
SuperNode serving each client), ``call`` (one stage, every addressed client's frame) and
``stop``.
"""

from __future__ import annotations

import json
import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from . import local_socket

#: the Flower message type every secure-fgl request travels as
MESSAGE_TYPE = "query"
#: the relay asks the SuperLink for replies after :data:`FIRST_PULL` seconds, then every 1.5 times longer, at
#: most every :data:`PULL_INTERVAL` seconds (each ask costs the SuperLink a query: a stage's replies take from a
#: fraction of a second, a SuperNode's poll and its site's answer, to many seconds)
FIRST_PULL, PULL_INTERVAL = 0.05, 0.25


#: the prefix of a client's frame among the ``ConfigRecord``'s entries (``"frame/<k>"``)
FRAME = "frame/"


def pack(header: dict, frames: dict[int, bytes]) -> RecordDict:
    """A Flower message's content: one ``ConfigRecord`` of ``header`` (str/int/float values) and each client's frame.

    Client ``k``'s frame is the ``bytes`` entry ``"frame/<k>"``, as it is: two Flower objects per message (an
    ``ArrayRecord`` would add three, each one more request to push and to pull).
    """
    return RecordDict({"sfgl": ConfigRecord({**header, **{f"{FRAME}{k}": bytes(f) for k, f in frames.items()}})})


def unpack(content: RecordDict) -> tuple[dict, dict[int, bytes]]:
    """Inverse of :func:`pack`."""
    record = content["sfgl"]
    frames = {int(n[len(FRAME) :]): v for n, v in record.items() if n.startswith(FRAME)}
    return {n: v for n, v in record.items() if not n.startswith(FRAME)}, frames


def message_bytes(message: Message) -> int:
    """The bytes of ``message`` as Flower serialises it.

    Its objects, deflated, without the HTTP/TLS framing below them.
    """
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(message).values())


# ----------------------------------------------------------------------------------- ClientApp
clientapp = ClientApp()


@clientapp.query()
def forward(message: Message, context: Context) -> Message:
    """Hand each client's frame to this site's client process, in client order; reply with its answers."""
    path = context.node_config.get("site-socket")
    if not path:
        raise ValueError(
            "this SuperNode has no site process: start it with --node-config "
            "'site-socket=\"<the --socket of python -m secure_fgl.runtime.flower_site>\"'"
        )
    header, frames = unpack(message.content)
    statuses, payloads = {}, {}
    for k in sorted(frames):
        with local_socket.connect(str(path), float(header["timeout"])) as sock:
            local_socket.send(sock, {"method": header["method"], "client": k}, frames[k])
            answer, payloads[k] = local_socket.receive(sock)
        statuses[str(k)] = {n: v for n, v in answer.items() if isinstance(v, (str, int, float, bool))}
    return Message(pack({"answers": json.dumps(statuses)}, payloads), reply_to=message)


# ----------------------------------------------------------------------------------- ServerApp
serverapp = ServerApp()


def _exchange(
    grid: Grid, node_of: dict[int, int], method: str, frames: dict[int, bytes], timeout: float
) -> tuple[dict, dict, int, int, int]:
    """Send ``frames[k]`` to client ``k``'s node, one message per node; wait at most ``timeout`` seconds for replies.

    Returns ``({k: (answer header, payload)}, {k: why lost}, Flower messages, Flower bytes down, Flower bytes up)``.
    """
    clients_of: dict[int, list[int]] = {}
    for k in sorted(frames):
        clients_of.setdefault(node_of[k], []).append(k)
    messages = {
        node: Message(
            pack({"method": method, "timeout": float(timeout)}, {k: frames[k] for k in ks}),
            dst_node_id=node,
            message_type=MESSAGE_TYPE,
            ttl=max(timeout, 1.0),
        )
        for node, ks in clients_of.items()
    }
    down = sum(message_bytes(m) for m in messages.values())
    pending = dict(zip(grid.push_messages(messages.values()), messages))
    replies, up, wait = {}, 0, FIRST_PULL
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
        wait = min(1.5 * wait, PULL_INTERVAL)
        for reply in grid.pull_messages(list(pending)):
            node = pending.pop(reply.metadata.reply_to_message_id, None)
            if node is not None:
                replies[node] = reply
                up += message_bytes(reply)
    lost = {k: f"no answer within {timeout:g} s" for node in pending.values() for k in clients_of[node]}
    answers = {}
    for node, reply in replies.items():
        if reply.has_error():
            lost.update({k: f"the site's ClientApp failed: {reply.error.reason}" for k in clients_of[node]})
            continue
        header, payloads = unpack(reply.content)
        statuses = json.loads(header["answers"])
        for k in clients_of[node]:
            if k in payloads and str(k) in statuses:
                answers[k] = (statuses[str(k)], payloads[k])
            else:
                lost[k] = "the site's reply has no answer for this client"
    return answers, lost, len(messages) + len(replies), down, up


def _find_sites(grid: Grid, clients: list[int], timeout: float) -> tuple[dict[int, int], list[int], dict]:
    """Ask every connected SuperNode which clients its site serves.

    Asks until each of ``clients`` has one or ``timeout`` seconds have passed. Returns client -> node, the clients
    that more than one site claims, and client -> its site's public answer (the optional requests it serves, its
    identity-key fingerprint).
    """
    node_of: dict[int, int] = {}
    twice: set[int] = set()
    hellos: dict[int, dict] = {}
    asked: set[int] = set()
    deadline = time.monotonic() + timeout
    while set(clients) - set(node_of) and time.monotonic() < deadline:
        new = sorted(set(grid.get_node_ids()) - asked)
        if not new:
            time.sleep(0.2)
            continue
        asked.update(new)
        answers, *_ = _exchange(
            grid,
            {i: n for i, n in enumerate(new)},
            "hello",
            {i: b"" for i in range(len(new))},
            max(1.0, deadline - time.monotonic()),
        )
        for i, (header, payload) in answers.items():
            site = json.loads(payload) if header.get("status") == "ok" else {"clients": []}
            for k in map(int, site["clients"]):
                if node_of.setdefault(k, new[i]) != new[i]:
                    twice.add(k)
                hellos[k] = {"serves": site.get("serves", {}), "identity": site.get("identities", {}).get(str(k))}
        asked.difference_update(new[i] for i in range(len(new)) if i not in answers)  # ask again
    return node_of, sorted(twice), hellos


@serverapp.main()
def relay(grid: Grid, context: Context) -> None:
    """Serve the driver's calls until it says ``stop`` or closes the socket."""
    sock = local_socket.connect(str(context.run_config["relay-socket"]), 60.0)
    sock.settimeout(None)  # the driver may compute for long between two calls
    node_of: dict[int, int] = {}
    with sock:
        while True:
            try:
                op, payload = local_socket.receive(sock)
            except local_socket.SocketClosed:
                return
            if op["op"] == "stop":
                local_socket.send(sock, {"status": "ok"})
                return
            if op["op"] == "sites":
                node_of, twice, hellos = _find_sites(grid, [int(k) for k in op["clients"]], float(op["timeout"]))
                local_socket.send(
                    sock,
                    {
                        "nodes": {str(k): n for k, n in node_of.items()},
                        "claimed_twice": twice,
                        "sites": {str(k): v for k, v in hellos.items()},
                    },
                )
                continue
            frames, offset = {}, 0  # op == "call"
            for k, n in op["sizes"]:
                frames[int(k)] = payload[offset : offset + n]
                offset += n
            unknown = {k: "no SuperNode serves this client" for k in frames if k not in node_of}
            answers, lost, messages, down, up = _exchange(
                grid, node_of, op["method"], {k: f for k, f in frames.items() if k not in unknown}, float(op["timeout"])
            )
            order = sorted(answers)
            local_socket.send(
                sock,
                {
                    "answers": [[k, len(answers[k][1]), answers[k][0]] for k in order],
                    "lost": {str(k): why for k, why in {**lost, **unknown}.items()},
                    "flower_messages": messages,
                    "flower_bytes_down": down,
                    "flower_bytes_up": up,
                },
                b"".join(answers[k][1] for k in order),
            )
