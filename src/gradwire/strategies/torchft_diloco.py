"""``torchft-diloco:H``: torchft's own DiLoCo (https://github.com/pytorch/torchft), a peer of ``diloco``.

torchft trains across *replica groups* that a lighthouse server gathers into
a quorum before every outer round; each group's ``Manager`` all_reduces
through a process group of its own that torchft rebuilds whenever the quorum
changes. Under gradwire every rank of the job is one replica group of one
rank:

1. the job's rank 0 starts a ``LighthouseServer`` that waits for all ranks
   (``min_replicas`` = the world: no round runs without every rank) and
   sends its address to the others over the strategy's own group;
2. every rank runs a ``Manager`` (a store of its own, a synchronous quorum,
   which DiLoCo needs) over :class:`GradwireReplicaGroup`: torchft's
   reconfigurable process-group wrapper whose group, rebuilt at each
   reconfiguration, is a gradwire group on the job's network model
   (:func:`gradwire.backend.group_over`), so its bytes and waits are on the
   simulated network, as every other row's;
3. torchft's ``DiLoCo`` takes the script's optimizer as the inner one and
   SGD with Nesterov momentum as the outer (``lr``, ``mu``: the paper's 0.7
   and 0.9 unless given); it hooks the inner optimizer's step: every ``H``
   steps the Manager runs a quorum, all_reduces each parameter's outer
   gradient (fp32, one all_reduce per tensor; ``:bucket``: torchft's
   ``use_bucketization``, packed into buckets of up to 1 GiB), and the outer step
   applies it.

What this row does not share with gradwire's ``diloco``: torchft's
arithmetic and exchange (per-tensor all_reduces, no compressor, no
streaming), and its control traffic: the quorum and commit RPCs and the
heartbeats go over real localhost sockets, not the simulated network (a
few milliseconds a round here).

Traps:
- torchft is optional (``pip install torchft``; 0.2.0 runs on this CPU with
  gloo). Without it the strategy is refused at the script's DDP, with the
  install line.
- ``init_sync=False``: every rank starts from the same weights (DDP's
  broadcast), so no replica heals from another at the first quorum (a
  healing would send the model over torchft's HTTP transport, off the
  simulated network).
- A rank that fails leaves the others in torchft's quorum until its timeout
  (the group's timeout here), then they raise a ``TimeoutError`` that says
  which round waited and why (torchft's own is a bare gRPC status).
"""
from __future__ import annotations

import importlib
import time
from datetime import timedelta
from typing import Any, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gradwire.exchange import Compressor

from .averaging import _Averaging
from .base import CannotApply, DDPAttachment, Timing, group_timeout, strategy_optimizers

__all__ = ["GradwireReplicaGroup", "TorchFTDiLoCoStrategy", "torchft_version"]

#: what a replica waits for a quorum, a reconfiguration or a commit unless the group says otherwise
DEFAULT_TIMEOUT = timedelta(seconds=120)
INSTALL = "pip install torchft (0.2.0 runs on CPU with gloo)"


def torchft_version() -> str | None:
    """The installed torchft's version, or None where it does not import."""
    try:
        module = importlib.import_module("torchft")
    except Exception:  # noqa: BLE001 - any import failure (missing, or built for another torch) means "not here"
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchft")
    except PackageNotFoundError:
        return str(getattr(module, "__version__", "unknown"))


def _require_torchft() -> str:
    """The installed torchft's version; :class:`CannotApply` with the install line where it does not import."""
    version = torchft_version()
    if version is None:
        raise CannotApply(f"torchft-diloco runs torchft's own DiLoCo, and torchft does not import here; {INSTALL}")
    return version


def _replica_group_class() -> type:
    """:class:`GradwireReplicaGroup`, built on the installed torchft's wrapper (imported only when used)."""
    from torchft.process_group import ProcessGroupWrapper

    class _GradwireReplicaGroup(ProcessGroupWrapper):
        """torchft's reconfigurable process group with a gradwire group inside (module doc, 2.)."""

        def _create_pg(self, store: dist.Store, rank: int, world_size: int) -> dist.ProcessGroup:
            from gradwire.backend import group_over

            return group_over(store, rank, world_size, self._timeout, f"torchft_{self._quorum_id}")

        def getBackendName(self) -> str:  # noqa: N802 - torchft's (and torch's) name
            return "torchft-gradwire"

    return _GradwireReplicaGroup


def GradwireReplicaGroup(timeout: timedelta = DEFAULT_TIMEOUT) -> Any:  # noqa: N802 - a class, built lazily
    """A torchft ``ProcessGroupWrapper`` whose group is a gradwire one on this process's network (module doc)."""
    return _replica_group_class()(timeout=timeout)


class TorchFTDiLoCoStrategy(_Averaging):
    """``torchft-diloco:H[:lr=..][:mu=..][:bucket]``: torchft's DiLoCo over gradwire groups (module doc).

    Runs on a script's own DDP (``gradwire compare -- CMD``): DDP sends
    nothing (a no-op hook), the script's optimizer is torchft's inner one.
    """

    name = "torchft-diloco"
    timing = Timing.AVERAGE

    def __init__(self, H: int, compressor: str | Compressor | None = None, momentum: float = 0.9,  # noqa: N803
                 group: dist.ProcessGroup | None = None, lr: float = 0.7, mu: float = 0.9, bucket: int = 0) -> None:
        super().__init__(H, compressor, momentum, group)
        #: torchft's ``use_bucketization``: the outer gradients packed into buckets of up to 1 GiB (its default),
        #: one all_reduce each, instead of one per parameter tensor (torchft's default)
        self.bucket = bool(bucket)
        self.outer_lr, self.outer_momentum = float(lr), float(mu)
        if not self.outer_lr > 0:
            raise ValueError(f"{self.name}: the outer lr must be > 0, got {lr}")
        if not 0 <= self.outer_momentum < 1:
            raise ValueError(f"{self.name}: the outer momentum must be in [0, 1), got {self.outer_momentum}")
        self._module: nn.Module | None = None
        self._inner: torch.optim.Optimizer | None = None
        self._lighthouse: Any = None
        self._store: Any = None
        self._manager: Any = None
        self._diloco: Any = None
        self._round_started: float | None = None
        self._timeout = DEFAULT_TIMEOUT

    def attach_ddp(self, ddp: DDP) -> DDPAttachment:
        """A no-op DDP hook; the lighthouse (rank 0) and this rank's Manager over a gradwire replica group."""
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

        version = _require_torchft()
        self.group = self.dedicated_group()
        self.wrap(ddp.module)
        sends = "in buckets" if self.bucket else "one all_reduce per tensor"
        return DDPAttachment(noop_hook, None, f"torchft {version} DiLoCo: local steps, every {self.period} a "
                                              f"quorum and the averaged outer gradient, {sends} (outer SGD lr "
                                              f"{self.outer_lr:g}, Nesterov {self.outer_momentum:g})")

    def wrap(self, model: nn.Module) -> nn.Module:
        """The same start on every rank, then the lighthouse (rank 0) and this rank's Manager (module doc)."""
        _require_torchft()
        module = super().wrap(model)
        self._module = model
        self._start(group_timeout(self.group) or DEFAULT_TIMEOUT)
        return module

    def _start(self, timeout: timedelta) -> None:
        from torchft import Manager
        from torchft.coordination import LighthouseServer

        group = self.group if self.group is not None else dist.group.WORLD
        assert group is not None
        self._timeout = timeout
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        address: list[Any] = [None]
        if rank == 0:
            self._lighthouse = LighthouseServer(bind="[::]:0", min_replicas=world)
            address = [self._lighthouse.address()]
        dist.broadcast_object_list(address, src=dist.get_global_rank(group, 0), group=group)
        self._store = dist.TCPStore("localhost", 0, 1, True, wait_for_workers=False, timeout=timeout)
        module = self._module
        assert module is not None
        self._manager = Manager(
            pg=GradwireReplicaGroup(timeout), min_replica_size=world, use_async_quorum=False,
            load_state_dict=module.load_state_dict, state_dict=module.state_dict, rank=0, world_size=1,
            store_addr="localhost", store_port=self._store.port, lighthouse_addr=address[0],
            replica_id=f"gradwire_{rank}", timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout,
            init_sync=False)

    def check_optimizer(self, optimizer: torch.optim.Optimizer, scheme: bool) -> None:
        """The script's optimizer is torchft's inner one (its step hooks run the rounds)."""
        super().check_optimizer(optimizer, scheme)
        self._inner = optimizer

    def _enter(self) -> None:
        """torchft's DiLoCo on the module, at the first step (its backup of the parameters is the first anchor)."""
        from torchft.local_sgd import DiLoCo

        assert self._module is not None and self._inner is not None, "attach_ddp and the optimizer come first"
        with strategy_optimizers():  # the script's optimizer stays the one an injection steps
            outer = torch.optim.SGD(self._module.parameters(), lr=self.outer_lr, momentum=self.outer_momentum,
                                    nesterov=self.outer_momentum > 0)
        # registered before torchft's own post-hook, so it marks where the inner step ended and the round begins
        self._inner.register_step_post_hook(self._mark)
        self._diloco = DiLoCo(self._manager, [self._module], self._inner, outer, sync_every=self.period,
                              use_bucketization=self.bucket)
        self._diloco.__enter__()

    def _mark(self, *_: Any) -> None:
        self._round_started = time.perf_counter() if (self.steps + 1) % self.period == 0 else None

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._inner is None and isinstance(optimizer, torch.optim.Optimizer):
            self._inner = optimizer  # gradwire's own loop hands the optimizer itself
        if self._diloco is None:
            self._enter()
        try:
            optimizer.step()  # torchft's post-hook: the round, every H steps
        except TimeoutError as exc:  # torchft's own words are a gRPC status ("Cancelled", "Timeout expired")
            raise TimeoutError(f"{self.name}: the quorum of round {self.averages + 1} (at step {self.steps + 1}) "
                               f"did not form within {self._timeout.total_seconds():g} s: a rank left the training "
                               f"or stopped answering (the others wait for every rank; torchft: {exc})") from exc
        if self._round_started is not None:
            self.add_wait(self._round_started, time.perf_counter())
            self._round_started = None
            self.averages += 1
        self.steps += 1

    def finish(self, optimizer: torch.optim.Optimizer) -> None:
        self.close()

    def close(self) -> None:
        """Leave the quorum and stop the servers (every rank's Manager before rank 0's lighthouse)."""
        if self._diloco is not None:
            self._diloco.__exit__(None, None, None)
            self._diloco = None
        if self._manager is not None:
            self._manager.shutdown(wait=False)
            self._manager = None
        if self._lighthouse is not None:
            self._lighthouse.shutdown()
            self._lighthouse = None

    def grad_scaler(self, scheme: bool) -> None:
        raise CannotApply("torchft's DiLoCo steps each rank on its own gradients; a GradScaler skipping a step on "
                          "some ranks would put them on different rounds; use bf16 autocast without a scaler")

    @classmethod
    def average_schedule(cls, params: Mapping[str, float]) -> tuple[int, int, bool]:
        return int(params["H"]), 1, False
