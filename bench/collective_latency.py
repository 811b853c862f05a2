"""The Python reference for collective_latency.cpp: the same all_reduce sizes through torch.distributed (Gloo), on the
same LibTorch. Launched by run_collective_latency.sh with the same environment as the C++ program."""
import os
import time

import torch
import torch.distributed as dist

rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
world = int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
dist.init_process_group("gloo", rank=rank, world_size=world)
for floats, iterations in [(1, 200), (256, 200), (65536, 50), (1048576, 10)]:
    t = torch.ones(floats)
    for _ in range(3):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(t)
    ms = (time.perf_counter() - start) * 1000 / iterations
    if rank == 0:
        print(f"python {world} {floats * 4} {ms:.4f}")
dist.destroy_process_group()
