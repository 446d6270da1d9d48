"""torch.distributed's all_reduce on the gloo backend (CPU), the workload of
crates/ember/examples/all_reduce.rs: float32 tensors of 4 KiB to 64 MiB, the median
time per call after a warm-up (each call after a barrier), and the bus bandwidth,
2 (world - 1) / world of the tensor's bytes per second.

Run by torchrun: python3 -m torch.distributed.run --nproc-per-node 2 bench/pytorch/all_reduce.py
"""
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = []
    for kib in [4, 64, 1024, 16 * 1024, 64 * 1024]:
        t = torch.ones(kib * 256, dtype=torch.float32)
        dist.all_reduce(t)
        reps = min(max(256 * 1024 // kib, 5), 200)
        times = []
        for _ in range(reps):
            dist.barrier()
            s = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - s)
        times.sort()
        rows.append((kib, times[len(times) // 2]))
    if rank == 0:
        print(f"all_reduce(sum) of float32 over {world} ranks (PyTorch {torch.__version__}, gloo)")
        print(f"{'size':>10}  {'median':>12}  {'bus bandwidth':>14}")
        for kib, secs in rows:
            bus = kib * 1024 * 2 * (world - 1) / world / secs
            print(f"{kib:>8} KiB  {secs * 1e6:>9.1f} µs  {bus / 1e9:>10.2f} GB/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
