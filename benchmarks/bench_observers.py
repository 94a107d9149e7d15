"""Observer update()/range() cost on a 64x128x384 float32 activation, per scheme, against numpy's min+max.

usage: python benchmarks/bench_observers.py
"""
import time

import numpy as np

from qcompiler.quant.calibration.observers import make_observer


def best(fn, n=5):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts) * 1e3


def main():
    x = np.random.default_rng(7).standard_normal((64, 128, 384)).astype(np.float32)
    base = best(lambda: (x.min(), x.max()))
    print(f"baseline numpy min+max: {base:.2f} ms")
    for scheme in ("min_max", "tf_enhanced", "percentile", "entropy", "mse"):
        obs = make_observer(scheme)
        obs.update(x)
        up = best(lambda: obs.update(x))
        rg = best(obs.range, 3)
        print(f"{scheme:<12} update {up:7.2f} ms ({up / base:5.1f}x numpy min+max)   range {rg:7.2f} ms")


if __name__ == "__main__":
    main()
