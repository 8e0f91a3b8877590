"""PyTorch's DDP tutorial style: ``init_process_group`` and ``destroy_process_group`` imported by name at import."""
import os

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    init_process_group(backend="gloo")
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
    destroy_process_group()
    if os.environ.get("BY_NAME_MARK"):  # after destroy: the record is there already
        out = os.environ["GRADWIRE_PROFILE_DIR"]
        rank = os.environ["RANK"]
        with open(os.environ["BY_NAME_MARK"] + rank, "w") as f:
            f.write(str(os.path.exists(os.path.join(out, f"rank{rank}.json"))))


if __name__ == "__main__":
    main()
