"""torch.load of a state dict beside a plain read of the file (the floor), for
bench/pt-load. Medians of 7 after one warm-up (the file in the page cache).

Run: python3 bench/pytorch/pt_load.py FILE
"""
import statistics
import sys
import time

import torch


def median_ms(f, n=7):
    f()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main(path):
    def read():
        with open(path, "rb") as f:
            f.read()

    read_ms = median_ms(read)
    load_ms = median_ms(lambda: torch.load(path, map_location="cpu"))
    print(f"pytorch {torch.__version__}: read the file {read_ms:.1f} ms, "
          f"torch.load {load_ms:.1f} ms ({load_ms / read_ms:.2f}x the read)")


if __name__ == "__main__":
    main(sys.argv[1])
