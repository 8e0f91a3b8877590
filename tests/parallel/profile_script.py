"""A job for `gradwire profile` in the tests: FSDP2 steps, then a two-stage GPipe schedule, on gloo as written."""
import datetime

import torch
import torch.distributed as dist

import workers  # tests/parallel/workers.py: torchrun puts this folder on sys.path

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
workers.fsdp2(rank, world, "gloo")
workers.pipeline(rank, world, "gloo", "gpipe")
dist.barrier()
dist.destroy_process_group()
