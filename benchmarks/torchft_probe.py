"""Whether torchft's DiLoCo runs on this machine: a lighthouse and 4 replica groups of one rank, gloo on CPU.

    python -m venv --system-site-packages /tmp/ftvenv && /tmp/ftvenv/bin/pip install torchft
    /tmp/ftvenv/bin/python benchmarks/torchft_probe.py 10 40      # H, steps

Not a gradwire row: torchft's Manager exchanges through its own reconfigurable ProcessGroupGloo, which
bypasses the gradwire backend, so its bytes and waits would not be on the simulated network. Each replica
prints (replica, seconds, last loss, outer rounds, sum of its parameters): equal sums mean the replicas met.
"""
import os, sys, time
from datetime import timedelta
import torch, torch.multiprocessing as mp
from torch import nn

def worker(i, n, lighthouse, H, steps, q):
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo
    torch.manual_seed(0)
    store = TCPStore("localhost", 0, 1, True, wait_for_workers=False)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    pg = ProcessGroupGloo(timeout=timedelta(seconds=30))
    m = Manager(pg=pg, load_state_dict=model.load_state_dict, state_dict=model.state_dict, min_replica_size=n,
                use_async_quorum=False, rank=0, world_size=1, store_addr="localhost", store_port=store.port,
                lighthouse_addr=lighthouse, replica_id=f"r{i}", timeout=timedelta(seconds=30))
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(i)
    with DiLoCo(m, [model], inner, outer, sync_every=H) as d:
        for s in range(steps):
            x = torch.randn(32, 16, generator=g); y = x.sum(1, keepdim=True)
            loss = nn.functional.mse_loss(model(x), y)
            inner.zero_grad(); loss.backward(); inner.step()
    q.put((i, time.perf_counter() - t0, float(loss), m.current_step(), sum(p.sum().item() for p in model.parameters())))
    m.shutdown()

if __name__ == "__main__":
    from torchft._torchft import LighthouseServer
    n, H, steps = 4, int(sys.argv[1]), int(sys.argv[2])
    lh = LighthouseServer(bind="[::]:0", min_replicas=n)
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(i, n, lh.address(), H, steps, q)) for i in range(n)]
    [p.start() for p in ps]
    for _ in range(n): print(q.get(timeout=300), flush=True)
    [p.join() for p in ps]; lh.shutdown()
