"""Names and addresses of one emulated cluster: pure functions, no netlink, no root.

A run builds ``K + 1`` network namespaces::

    gw-<run>-sw     the switch: bridge gw-br, one port gw-p<i> per node
    gw-<run>-n<i>   node i: lo and gw-eth (its end of the veth pair to gw-p<i>),
                    address <subnet> host i + 1, e.g. 10.250.0.1 for node 0

Every namespace name starts with :data:`PREFIX`, and ``<run>`` is
``<pid>-<start>``: the emulating process's pid and its start time (clock ticks
since boot, field 22 of ``/proc/<pid>/stat``). The next run reads both back to
tell a live set from one left by a killed run; a pid alone could be recycled
by an unrelated process and keep a stale set alive forever.

Interfaces exist only inside namespaces made here, so their fixed names
cannot collide with the host's, and an address inside them never reaches the
host's routing. Interface names fit Linux's 15-character limit (IFNAMSIZ).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = [
    "BRIDGE", "DEFAULT_PORT", "DEFAULT_SUBNET", "NODE_IF", "PREFIX", "PRIVATE_NETS", "Layout", "RunId", "port_if",
]

#: first characters of every namespace (and interface) this package creates
PREFIX = "gw-"
#: a node's interface, the same name in every node namespace (GLOO_SOCKET_IFNAME)
NODE_IF = "gw-eth"
#: the bridge in the switch namespace
BRIDGE = "gw-br"
#: node 0's port for torchrun's static rendezvous (inside node 0's namespace)
DEFAULT_PORT = 29400
DEFAULT_SUBNET = ipaddress.IPv4Network("10.250.0.0/24")
#: RFC 1918 ranges: the only subnets a run accepts
PRIVATE_NETS: tuple[ipaddress.IPv4Network, ...] = tuple(
    ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
)


def port_if(node: int) -> str:
    """The switch port of ``node``."""
    return f"{PREFIX}p{node}"


@dataclass(frozen=True)
class RunId:
    """Who owns a set of namespaces: a process, named by pid and start time."""

    pid: int
    start: int
    """start time of the process in clock ticks since boot"""

    def __str__(self) -> str:
        return f"{self.pid}-{self.start}"

    @classmethod
    def of_namespace(cls, name: str) -> "RunId | None":
        """The owner encoded in a namespace name, or None if the name is not one of ours."""
        if not name.startswith(PREFIX):
            return None
        parts = name[len(PREFIX):].split("-")
        if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
            return None
        return cls(int(parts[0]), int(parts[1]))


@dataclass(frozen=True)
class Layout:
    """Nodes, ranks per node, names and addresses of one run."""

    nodes: int
    per_node: int
    """torchrun ranks per node (``--nproc-per-node``)"""
    run: RunId
    subnet: ipaddress.IPv4Network = DEFAULT_SUBNET
    port: int = DEFAULT_PORT
    """rendezvous port on node 0"""

    def __post_init__(self) -> None:
        for name in ("nodes", "per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        subnet = ipaddress.ip_network(self.subnet)
        if not isinstance(subnet, ipaddress.IPv4Network) or not any(subnet.subnet_of(n) for n in PRIVATE_NETS):
            raise ValueError(f"subnet {self.subnet} is not a private IPv4 subnet; use one inside "
                             f"{', '.join(map(str, PRIVATE_NETS))}, e.g. {DEFAULT_SUBNET}")
        if subnet.num_addresses - 2 < self.nodes:
            raise ValueError(f"subnet {subnet} has {max(subnet.num_addresses - 2, 0)} host addresses, "
                             f"fewer than {self.nodes} nodes; widen it")
        object.__setattr__(self, "subnet", subnet)
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port must be in 1..65535, got {self.port}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.per_node

    @property
    def switch_ns(self) -> str:
        return f"{PREFIX}{self.run}-sw"

    def node_ns(self, node: int) -> str:
        self._check(node)
        return f"{PREFIX}{self.run}-n{node}"

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace of the run, the switch first."""
        return (self.switch_ns, *(self.node_ns(i) for i in range(self.nodes)))

    def address(self, node: int) -> ipaddress.IPv4Interface:
        """Node ``node``'s address with the subnet's prefix length."""
        self._check(node)
        return ipaddress.IPv4Interface(f"{self.subnet.network_address + node + 1}/{self.subnet.prefixlen}")

    @property
    def rdzv_endpoint(self) -> str:
        """``host:port`` of the rendezvous: node 0's address."""
        return f"{self.address(0).ip}:{self.port}"

    def _check(self, node: int) -> None:
        if not 0 <= node < self.nodes:
            raise ValueError(f"node {node} is outside 0..{self.nodes - 1}")
