"""Run by tests under torchrun: the backend comes from init_process_group("gradwire")."""
import json
import os
import sys

import torch
import torch.distributed as dist

import gradwire

dist.init_process_group("gradwire")
t = torch.ones(1 << 16)
dist.all_reduce(t)
s = gradwire.stats().as_dict()["all_reduce"]
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"value": t[0].item(), "world": dist.get_world_size(), "model": s["model_seconds"],
                   "spec": gradwire.network().spec.to_string(), "env": os.environ.get("GRADWIRE_NET")}, f)
dist.destroy_process_group()
