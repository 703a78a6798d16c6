"""The benchmarks' timers: CUDA-graph replays, and eager calls between CUDA events
(benchmarks/ is not a package: the scripts put this folder on sys.path and
`import graph_timing`)."""

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


def graph_us_per_call(fns, warmup: int = 10, rep: int = 60) -> float:
    """Median microseconds per call of one CUDA-graph replay holding every fn of `fns` in
    order (`triton.testing.do_bench`, L2 flushed before each replay), divided by len(fns).
    Give each fn its own inputs: then every call but the first still reads cold records, as
    the attention of one layer after another does in a served step, and the graph's launch
    cost is paid once for all of them instead of once per call (graph_us). Each fn runs once
    eagerly, then all are captured."""
    import triton.testing

    for fn in fns:
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    t = triton.testing.do_bench(g.replay, warmup=warmup, rep=rep, return_mode="median") * 1e3
    del g
    return t / len(fns)


def eager_us(fn, warmup: int = 3, rep: int = 20) -> float:
    """Median microseconds of eager calls of fn(), CUDA events around each (host syncs and
    launch overheads included), after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rep):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return sorted(times)[len(times) // 2]


def host_us_behind(fn, busy_cycles: int = 40_000_000, rep: int = 7) -> float:
    """Median microseconds the host spends in one eager call of fn() issued while the GPU still
    has `busy_cycles` of queued work (`torch.cuda._sleep`: ~20 ms at 1.98 GHz). Without a host
    sync in fn this is its launch cost; with one it includes waiting for the queue to drain,
    which is what a served forward, whose host runs layers ahead of the GPU, loses at each
    such call."""
    import time

    fn()
    times = []
    for _ in range(rep):
        torch.cuda.synchronize()
        torch.cuda._sleep(busy_cycles)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]
