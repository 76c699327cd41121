"""Writes N x D standard-normal f32 vectors (numpy's default_rng(SEED)) as an .fvecs file: the
synthetic set of the GPU machine's persistence and k-means benchmarks.

    python3 scripts/make_gaussian_fvecs.py OUT [--rows 1000000] [--dim 128] [--seed 7]
"""
import argparse

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--rows", type=int, default=1_000_000)
p.add_argument("--dim", type=int, default=128)
p.add_argument("--seed", type=int, default=7)
args = p.parse_args()
rows = np.random.default_rng(args.seed).standard_normal((args.rows, args.dim), dtype=np.float32)
out = np.empty((args.rows, args.dim + 1), dtype=np.float32)
out[:, 0] = np.array([args.dim], dtype=np.int32).view(np.float32)[0]
out[:, 1:] = rows
out.tofile(args.out)
