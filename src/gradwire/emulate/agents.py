"""One torchrun agent per node, started inside the node's namespace, with a real multi-node rendezvous.

The command lines are pure (:func:`torchrun_argv`, :func:`agent_env`); only
:func:`start_agent` touches the system. Each agent runs::

    python -m torch.distributed.run --nnodes K --node-rank i --nproc-per-node M
        --rdzv-backend static --rdzv-endpoint <node 0>:<port> --local-addr <node i>
        --no-python CMD ...

The static rendezvous makes node ``i`` torchrun's ``GROUP_RANK`` ``i``, so its
ranks are ``i*M .. i*M + M-1``: the layout ``topology=KxM`` prices. Workers
get ``GLOO_SOCKET_IFNAME=gw-eth``, so gloo binds the node's shaped interface.

Traps:

- An agent is started in a session of its own, so a Ctrl-C at the terminal
  reaches only the emulating process, which then stops the agents in order
  and tears the network down (a terminal's SIGINT would otherwise hit every
  process at once, racing the teardown).
- Each agent asks the kernel for SIGTERM when the emulating process dies
  (``PR_SET_PDEATHSIG``): after a ``kill -9`` of the parent the agents stop
  their workers instead of waiting forever on a rendezvous. The namespaces
  stay until the next run finds them (:func:`gradwire.emulate.netlink.stale`).
- Every node shares this host's cores. torchrun sets ``OMP_NUM_THREADS=1``
  only for several ranks per node; one rank per node would size torch's
  thread pool to every core, and on a busy host the pool's threads wait on
  each other (a 1 MB copy measured 10-45 ms). Unless the caller set it, each
  rank gets ``cores // ranks``, at least 1.
- Names of the peers do not resolve inside the namespaces (there is no DNS
  there); c10d warns "The hostname of the client socket cannot be
  retrieved" and carries on with addresses.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Mapping, Sequence

from gradwire.emulate.host import NETNS_DIR
from gradwire.emulate.layout import NODE_IF, Layout

__all__ = ["EMULATED_NET_ENV", "agent_env", "start_agent", "torchrun_argv"]

#: the agents' environment names the model spec of the emulated network here
EMULATED_NET_ENV = "GRADWIRE_EMULATED_NET"

_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1


def torchrun_argv(layout: Layout, node: int, cmd: Sequence[str], python: str = sys.executable) -> list[str]:
    """The agent's command line for ``node``; a ``cmd`` that starts with a ``.py`` file runs under ``python``."""
    if not cmd:
        raise ValueError("no command given: use `gradwire emulate ... -- python train.py ...`")
    cmd = list(cmd)
    if cmd[0].endswith(".py"):
        cmd = [python, *cmd]
    return [
        python, "-m", "torch.distributed.run",
        f"--nnodes={layout.nodes}", f"--node-rank={node}", f"--nproc-per-node={layout.per_node}",
        "--rdzv-backend=static", f"--rdzv-endpoint={layout.rdzv_endpoint}",
        f"--local-addr={layout.address(node).ip}", "--no-python", *cmd,
    ]


def agent_env(base: Mapping[str, str], model_spec: str, world_size: int, cores: int) -> dict[str, str]:
    """The agents' environment: ``base``, the interface gloo binds, the model spec, the ranks' share of the cores."""
    env = dict(base)
    env["GLOO_SOCKET_IFNAME"] = NODE_IF
    env[EMULATED_NET_ENV] = model_spec
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // world_size)))
    return env


def start_agent(namespace: str, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen:
    """Start ``argv`` inside ``namespace``, in a session of its own, to get SIGTERM when this process dies.

    The namespace is entered between fork and exec with ``setns(2)`` on an
    fd opened here; this process holds no threads (pyroute2's sockets are
    closed), which is what makes a ``preexec_fn`` safe.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()
    fd = os.open(NETNS_DIR / namespace, os.O_RDONLY | os.O_CLOEXEC)

    def enter() -> None:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {namespace}: {os.strerror(err)}")
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl: no signal would ever come
            os._exit(1)

    try:
        return subprocess.Popen(list(argv), env=dict(env), preexec_fn=enter, start_new_session=True)
    finally:
        os.close(fd)
