"""The benchmarks' CUDA-graph timer (benchmarks/ is not a package: the scripts put this folder on
sys.path and `import graph_timing`)."""

from __future__ import annotations

import torch


def graph_us(fn, warmup: int = 10, rep: int = 60) -> float:
    """Median microseconds of one CUDA-graph replay of fn() (`triton.testing.do_bench`, L2
    flushed before each replay): fn() runs once eagerly, then is captured."""
    import triton.testing

    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    t = triton.testing.do_bench(g.replay, warmup=warmup, rep=rep, return_mode="median") * 1e3
    del g
    return t
