"""The netlink adapter (pyroute2): probe the kernel, build a :class:`~gradwire.emulate.plan.EmulationPlan`, take it down.

Build order, all inside namespaces this run creates (nothing touches the
host's own namespace):

1. one namespace per node and one for the switch;
2. in the switch: the bridge, then per node a veth pair whose far end moves
   into the node's namespace and is renamed ``gw-eth``;
3. in each node: lo up, the address, ``gw-eth`` up;
4. the qdiscs of every :class:`~gradwire.emulate.plan.Port`: the rate limiter
   at the root, and netem under each of its leaves (or at the root without a
   rate). tbf is one bucket and one queue. htb is a class 1:1 at the link
   rate with two children that may each use all of it: 1:10 at priority 0
   for small TCP packets (a u32 filter: IP protocol 6, total length below
   128 bytes, i.e. pure ACKs) and 1:20 at priority 1 for everything else
   (see :mod:`gradwire.emulate.plan` for why ACKs go first).

Before teardown, :func:`traffic` reads what the packets met: each node's TCP
retransmissions and retransmission timeouts (its namespace's own counters in
``/proc/net/snmp`` and ``netstat``), and the packets each shaper and each veth
dropped. The model of a spec without ``loss`` drops nothing; a run whose real
packets were dropped and resent took time the model does not price, and says so.
A resend is not a loss: TCP also resends the last segment of a burst that is
not acknowledged within about two round trips (a tail-loss probe), and a
segment that waited long in a shaper's queue can be resent before its ACK
returns. The receiver then reports the second copy as a duplicate (D-SACK);
those counts are printed beside the resends, so that resends without drops
read as what they were: late ACKs, not lost packets.

Teardown deletes the switch ports (each takes its veth pair and both ends'
qdiscs with it) and then the namespaces, so nothing is left for the kernel to
reap later. Every namespace is opened with ``flags=0``: pyroute2 would
otherwise create a missing one (its default is ``O_CREAT``).
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Iterable

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from gradwire.emulate.host import NETNS_DIR, EmulationUnavailable, alive, kill_inside
from gradwire.emulate.layout import BRIDGE, NODE_IF, PREFIX, Layout, RunId, port_if
from gradwire.emulate.plan import Capabilities, EmulationPlan, Port, RateLimit

__all__ = ["Links", "Traffic", "build", "links", "namespaces", "probe", "qdisc_kinds", "remove", "stale", "teardown", "traffic"]

TC_H_ROOT = 0xFFFFFFFF
_ROOT_HANDLE = 0x10000  # 1:
_CLASS = 0x10001  # 1:1, tbf's one class or htb's class at the link rate
_ACK_CLASS = 0x10010  # 1:10, htb: small TCP packets, priority 0
_BULK_CLASS = 0x10020  # 1:20, htb: everything else, priority 1
_ACK_SHARE = 0.05  # guaranteed share of the ACK class; both classes may borrow up to the link rate
_ETH_P_IP = 0x0800
#: u32 keys (value/mask+byte offset of a 32-bit word of the IP header): protocol TCP, total length < 128
_SMALL_TCP = ["0x00060000/0x00ff0000+8", "0x00000000/0x0000ff80+0"]
_PROBED = ("tbf", "htb", "netem")


def _ipr(namespace: str) -> IPRoute:
    return IPRoute(netns=namespace, flags=0)


def _index(ipr: IPRoute, name: str) -> int:
    found = ipr.link_lookup(ifname=name)
    if not found:
        raise RuntimeError(f"interface {name} is missing")
    return found[0]


def probe(run: RunId) -> Capabilities:
    """Try what this kernel can do in a scratch namespace, then remove it.

    Raises:
        EmulationUnavailable: no namespace, veth pair or bridge can be made
            here; the message says what is needed.
    """
    name = f"{PREFIX}{run}-probe"
    try:
        netns.create(name)
    except OSError as exc:
        raise EmulationUnavailable(f"cannot create a network namespace ({exc.strerror or exc}); gradwire emulate "
                                   "needs CAP_SYS_ADMIN and CAP_NET_ADMIN (root, or a privileged container)") from None
    try:
        with _ipr(name) as ipr:
            for kind, what in (("veth", "veth pairs (CONFIG_VETH)"), ("bridge", "bridges (CONFIG_BRIDGE)")):
                try:
                    if kind == "veth":
                        ipr.link("add", ifname="gw-a", kind="veth", peer={"ifname": "gw-b"})
                    else:
                        ipr.link("add", ifname=BRIDGE, kind="bridge")
                except NetlinkError as exc:
                    raise EmulationUnavailable(f"gradwire emulate needs {what}; this kernel refused one "
                                               f"({os.strerror(exc.code)})") from None
            index = _index(ipr, "gw-a")
            found, filters = set(), set()
            for kind in _PROBED:
                try:
                    ipr.tc("add", kind, index=index, **_probe_args(kind))
                except NetlinkError:
                    continue
                found.add(kind)
                if kind == "htb":
                    try:
                        _add_ack_filter(ipr, index)
                        filters.add("u32")
                    except NetlinkError:
                        pass
                ipr.tc("del", index=index, parent=TC_H_ROOT)
    finally:
        remove([name])
    return Capabilities(frozenset(found), frozenset(filters))


def _add_ack_filter(ipr: IPRoute, index: int) -> None:
    ipr.tc("add-filter", "u32", index=index, parent=_ROOT_HANDLE, prio=1, protocol=_ETH_P_IP,
           target=_ACK_CLASS, keys=_SMALL_TCP)


def _probe_args(kind: str) -> dict:
    if kind == "tbf":
        return {"rate": 125_000, "burst": 32 << 10, "limit": 64 << 10}
    if kind == "htb":
        return {"handle": _ROOT_HANDLE, "default": _BULK_CLASS & 0xFFFF}
    return {"delay": 1000}


def build(plan: EmulationPlan) -> None:
    """Create the namespaces, links, addresses and qdiscs of ``plan``.

    On an error it raises with what was built left in place: the caller
    tears it down (:func:`teardown`), as :class:`~gradwire.emulate.runner.Emulation` does.
    """
    lay = plan.layout
    for name in lay.namespaces:
        netns.create(name)
    with _ipr(lay.switch_ns) as sw:
        sw.link("add", ifname=BRIDGE, kind="bridge")
        bridge = _index(sw, BRIDGE)
        sw.link("set", index=bridge, state="up")
        for node in range(lay.nodes):
            far = f"{PREFIX}h{node}"
            sw.link("add", ifname=port_if(node), kind="veth", peer={"ifname": far})
            sw.link("set", index=_index(sw, far), net_ns_fd=lay.node_ns(node))
            sw.link("set", index=_index(sw, port_if(node)), master=bridge, state="up")
    for node in range(lay.nodes):
        with _ipr(lay.node_ns(node)) as ipr:
            ipr.link("set", index=_index(ipr, "lo"), state="up")
            index = _index(ipr, f"{PREFIX}h{node}")
            ipr.link("set", index=index, ifname=NODE_IF)
            addr = lay.address(node)
            ipr.addr("add", index=index, address=str(addr.ip), prefixlen=addr.network.prefixlen)
            ipr.link("set", index=index, state="up")
    for port in plan.ports:
        _shape(port)


def _shape(port: Port) -> None:
    with _ipr(port.namespace) as ipr:
        index = _index(ipr, port.device)
        leaves = [TC_H_ROOT]
        rate = port.rate
        if rate is not None and rate.kind == "tbf":
            ipr.tc("add", "tbf", index=index, handle=_ROOT_HANDLE, rate=rate.rate_bytes, burst=rate.burst,
                   limit=rate.limit)
            leaves = [_CLASS]
        elif rate is not None:
            ipr.tc("add", "htb", index=index, handle=_ROOT_HANDLE, default=_BULK_CLASS & 0xFFFF)
            for handle, args in _htb_classes(rate):
                ipr.tc("add-class", "htb", index=index, handle=handle, **args)
            _add_ack_filter(ipr, index)
            leaves = [_ACK_CLASS, _BULK_CLASS]
        imp = port.impairment
        for n, leaf in enumerate(leaves if imp is not None else []):  # ACKs meet the delay and the loss too
            assert imp is not None
            ipr.tc("add", "netem", index=index, handle=(2 + n) << 16, parent=leaf, delay=imp.delay * 1e6,
                   jitter=imp.jitter * 1e6, loss=imp.loss * 100, limit=10_000)


def _htb_classes(rate: RateLimit) -> list[tuple[int, dict]]:
    """(handle, arguments) of htb's three classes for ``rate`` (module doc), parents first."""
    link = {"ceil": rate.rate_bytes, "burst": rate.burst, "cburst": rate.burst, "quantum": 200_000}
    ack = max(int(rate.rate_bytes * _ACK_SHARE), 1)
    return [(_CLASS, {"parent": _ROOT_HANDLE, "rate": rate.rate_bytes, **link}),
            (_ACK_CLASS, {"parent": _CLASS, "rate": ack, "prio": 0, **link}),
            (_BULK_CLASS, {"parent": _CLASS, "rate": rate.rate_bytes - ack, "prio": 1, **link})]


class Links:
    """Netlink sockets into a built plan's namespaces, held open to change its links while a run goes on.

    Opening a socket inside a namespace forks a helper (pyroute2), tens of
    milliseconds on a busy host; held open, a change costs one netlink
    request per class or qdisc (``apply`` returns how long it took). Open
    it after the agents have started: their start forks this process, which
    must hold no threads then (:func:`gradwire.emulate.agents.start_agent`).

    - :meth:`set_rate` changes a port's token bucket in place: tbf's
      parameters (``tc qdisc change``), or htb's three classes (``tc class
      change``); queued packets and connections stay;
    - :meth:`set_up` sets every switch port up or down; a node's ``gw-eth``
      follows as its carrier (a pulled cable, see :mod:`gradwire.emulate.timeline`).
    """

    def __init__(self, plan: EmulationPlan) -> None:
        self.plan = plan
        self._ipr: dict[str, IPRoute] = {}
        self._index: dict[tuple[str, str], int] = {}
        try:
            for port in plan.ports:
                ipr = self._open(port.namespace)
                self._index[(port.namespace, port.device)] = _index(ipr, port.device)
            sw = self._open(plan.layout.switch_ns)
            for node in range(plan.layout.nodes):
                self._index[(plan.layout.switch_ns, port_if(node))] = _index(sw, port_if(node))
        except BaseException:
            self.close()
            raise

    def _open(self, namespace: str) -> IPRoute:
        if namespace not in self._ipr:
            self._ipr[namespace] = _ipr(namespace)
        return self._ipr[namespace]

    def set_rate(self, port: Port, rate: RateLimit) -> None:
        """Give ``port`` the token bucket ``rate`` (its kind must be the one built)."""
        ipr = self._ipr[port.namespace]
        index = self._index[(port.namespace, port.device)]
        if rate.kind == "tbf":
            ipr.tc("change", "tbf", index=index, handle=_ROOT_HANDLE, rate=rate.rate_bytes, burst=rate.burst,
                   limit=rate.limit)
            return
        for handle, args in _htb_classes(rate):
            ipr.tc("change-class", "htb", index=index, handle=handle, **args)

    def set_up(self, up: bool) -> None:
        """Set every switch port up (``True``) or down."""
        sw = self._ipr[self.plan.layout.switch_ns]
        for node in range(self.plan.layout.nodes):
            sw.link("set", index=self._index[(self.plan.layout.switch_ns, port_if(node))],
                    state="up" if up else "down")

    def rates(self, port: Port) -> list[int]:
        """The rates (bytes/s) the kernel holds for ``port``'s limiter now: tbf's, or htb's three classes."""
        ipr = self._ipr[port.namespace]
        index = self._index[(port.namespace, port.device)]
        if port.rate is not None and port.rate.kind == "htb":
            found = []
            for cls in ipr.get_classes(index=index):
                opts = cls.get_attr("TCA_OPTIONS")
                params = opts.get_attr("TCA_HTB_PARMS") if opts is not None else None
                if params is not None:
                    found.append(int(params["rate"]))
            return sorted(found)
        out = []
        for q in ipr.get_qdiscs(index=index):
            opts = q.get_attr("TCA_OPTIONS")
            params = opts.get_attr("TCA_TBF_PARMS") if opts is not None else None
            if params is not None:
                out.append(int(params["rate"]))
        return out

    def is_up(self) -> list[bool]:
        """Whether each node's ``gw-eth`` has its carrier (operstate UP)."""
        out = []
        for node in range(self.plan.layout.nodes):
            ns = self.plan.layout.node_ns(node)
            link = self._ipr[ns].get_links(self._index[(ns, NODE_IF)])[0]
            out.append(link.get_attr("IFLA_OPERSTATE") == "UP")
        return out

    def close(self) -> None:
        """Close every socket (idempotent)."""
        for ipr in self._ipr.values():
            try:
                ipr.close()
            except OSError:
                pass
        self._ipr.clear()


def qdisc_kinds(namespace: str, device: str) -> list[str]:
    """Kinds of the qdiscs on ``device`` in ``namespace``, root first (``noqueue`` when unshaped)."""
    with _ipr(namespace) as ipr:
        index = _index(ipr, device)
        return [q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(index=index)]


def links(namespace: str | None = None) -> list[str]:
    """Interface names in ``namespace`` (None: this process's own) that carry :data:`PREFIX`."""
    with (IPRoute() if namespace is None else _ipr(namespace)) as ipr:
        names = [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()]
    return [n for n in names if n.startswith(PREFIX)]


def namespaces() -> list[str]:
    """Every namespace name on this host that carries :data:`PREFIX`."""
    return sorted(n for n in netns.listnetns() if n.startswith(PREFIX))


def stale() -> list[str]:
    """Namespaces of ours whose owning run is gone (killed before it could clean up)."""
    found = []
    for name in namespaces():
        run = RunId.of_namespace(name)
        if run is not None and not alive(run):
            found.append(name)
    return found


def teardown(layout: Layout) -> list[str]:
    """Remove everything ``layout`` created, whatever state a failed build left; return what could not go."""
    if (NETNS_DIR / layout.switch_ns).exists():
        try:
            with _ipr(layout.switch_ns) as sw:
                for name in [port_if(i) for i in range(layout.nodes)] + [BRIDGE]:
                    found = sw.link_lookup(ifname=name)
                    if found:
                        sw.link("del", index=found[0])
        except (OSError, NetlinkError):
            pass  # removing the namespaces below still takes the links with them
    return remove(layout.namespaces)


def remove(names: Iterable[str]) -> list[str]:
    """Kill what runs inside each namespace, then remove it; return the names that are still there."""
    left = []
    for name in names:
        kill_inside(name)
        try:
            netns.remove(name)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                left.append(f"{name} ({exc.strerror})")
    return left


@dataclass(frozen=True)
class Traffic:
    """What the real packets of a run met (:func:`traffic`): counts over every node and port."""

    segments: int
    """TCP segments the nodes sent"""
    retransmitted: int
    """TCP segments sent again"""
    timeouts: int
    """retransmission timeouts (a sender waited at least 200 ms before sending again)"""
    shaper_drops: int
    """packets the rate limiters (and netem under them) dropped"""
    link_drops: int
    """packets the veths dropped (a receiver's backlog full)"""
    probes: int = 0
    """tail-loss probes: when a burst's ACK is late (about two round trips), TCP sends one segment to
    provoke it, usually the burst's last segment again"""
    duplicates: int = 0
    """resent segments the receiver reported as already received (D-SACK): the original arrived"""

    def describe(self) -> str:
        line = (f"real packets: {self.segments} TCP segments sent, {self.retransmitted} resent "
                f"({self.timeouts} after a timeout, {self.probes} tail-loss probes; {self.duplicates} received twice); "
                f"dropped: {self.shaper_drops} by the shapers, {self.link_drops} by the links")
        if self.timeouts or self.shaper_drops or self.link_drops:
            line += " (time the model of a spec without loss does not price)"
        return line


def _tcp_counters(namespace: str) -> dict[str, int]:
    """``/proc/net/snmp`` Tcp and ``/proc/net/netstat`` TcpExt counters of ``namespace``."""
    netns.pushns(namespace)
    try:
        texts = [open(f"/proc/self/net/{name}").read() for name in ("snmp", "netstat")]
    finally:
        netns.popns()
    out: dict[str, int] = {}
    for text in texts:
        lines = text.splitlines()
        for names, values in zip(lines[::2], lines[1::2]):
            if names.split()[0] in ("Tcp:", "TcpExt:"):
                out.update(zip(names.split()[1:], (int(v) for v in values.split()[1:])))
    return out


def _drops(namespace: str, device: str) -> tuple[int, int]:
    """(packets the root qdisc of ``device`` dropped, packets the device itself dropped)."""
    with _ipr(namespace) as ipr:
        index = _index(ipr, device)
        qdisc = sum((q.get_attr("TCA_STATS") or {}).get("drop", 0) for q in ipr.get_qdiscs(index=index)
                    if q["parent"] == TC_H_ROOT)
        stats = ipr.get_links(index)[0].get_attr("IFLA_STATS64") or {}
        return qdisc, stats.get("tx_dropped", 0) + stats.get("rx_dropped", 0)


def traffic(plan: EmulationPlan) -> Traffic:
    """Read what the run's packets met, from the namespaces of ``plan`` (before teardown; module doc)."""
    nodes = [_tcp_counters(plan.layout.node_ns(node)) for node in range(plan.layout.nodes)]
    tcp = {name: sum(n.get(name, 0) for n in nodes)
           for name in ("OutSegs", "RetransSegs", "TCPTimeouts", "TCPLossProbes", "TCPDSACKRecvSegs")}
    shaper = link = 0
    for port in plan.ports:
        q, d = _drops(port.namespace, port.device)
        shaper, link = shaper + q, link + d
    return Traffic(tcp["OutSegs"], tcp["RetransSegs"], tcp["TCPTimeouts"], shaper, link,
                   probes=tcp["TCPLossProbes"], duplicates=tcp["TCPDSACKRecvSegs"])
