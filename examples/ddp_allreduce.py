#!/usr/bin/env python3
"""PyTorch DDP smoke test: every rank all-reduces its rank number over gloo (CPU).

Initialises torch.distributed from the environment corral sets (MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE), so a correct result (sum = 0+1+...+N-1 on
every rank) proves the rank env of a whole gang is consistent. Prints one
JSON line, and writes it to --out-dir/result-rank<R>.json when given.
Exits 2 when torch is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out-dir", default=os.environ.get("DDP_OUT_DIR"))
    args = p.parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("torch is not installed", file=sys.stderr)
        return 2

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    dist.barrier()
    dist.destroy_process_group()

    result = {"rank": rank, "world_size": world, "sum": t.item(), "expected": world * (world - 1) / 2}
    print(json.dumps(result), flush=True)
    if args.out_dir:
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.out_dir) / f"result-rank{rank}.json").write_text(json.dumps(result))
    return 0 if result["sum"] == result["expected"] else 1


if __name__ == "__main__":
    sys.exit(main())
