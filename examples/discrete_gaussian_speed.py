"""Samples per second of the exact discrete Gaussian sampler (``SecureRandom.discrete_gaussian``).

    python examples/discrete_gaussian_speed.py [--sizes 100000,1000000] [--sigmas 2,3.7,21810380.8]

One client's draw of N_Z(0, sigma^2) noise, CPU time of the calling process; sigma in grid steps
(2 is the floor of a distributed share, 1.3 x 2^24 a unit std on the default 2^-24 grid).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from protocols.csprng import SecureRandom


def main() -> None:
    """Print samples/s and the sample variance over sigma^2 for each (sigma, size)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--sigmas", default="2,3.7,21810380.8")
    args = parser.parse_args()
    rng = SecureRandom()
    print("| sigma (steps) | entries | samples/s | variance / sigma^2 |\n|---|---|---|---|")
    for sigma in (float(s) for s in args.sigmas.split(",")):
        for n in (int(k) for k in args.sizes.split(",")):
            start = time.process_time()
            x = rng.discrete_gaussian(sigma, n)
            seconds = time.process_time() - start
            print(f"| {sigma:g} | {n:,} | {n / seconds:,.0f} | {float(np.mean(x * x)) / sigma**2:.4f} |")


if __name__ == "__main__":
    main()
