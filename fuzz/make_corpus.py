#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/): small valid files of each
format, most cut from the repository's data/siftsmall and data/fmnistsmall to a few rows, and a
few malformed ones. Run from anywhere; it replaces the seeds it writes and leaves other files
(inputs a campaign found and someone chose to keep) alone.
"""

import gzip
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def fvecs_rows(path, rows):
    """The first `rows` records of a TEXMEX file, as (dim, raw value bytes) pairs."""
    data = (ROOT / path).read_bytes()
    dim = struct.unpack_from("<i", data)[0]
    size = 4 + 4 * dim
    return [(dim, data[i * size + 4:(i + 1) * size]) for i in range(rows)]


def texmex(records):
    return b"".join(struct.pack("<i", dim) + values for dim, values in records)


def floats(raw):
    return struct.unpack("<%df" % (len(raw) // 4), raw)


def npy(header, data, major=1):
    """An npy file as NumPy writes it: the header padded with spaces and a newline to 64 bytes."""
    len_size = 2 if major == 1 else 4
    unpadded = 6 + 2 + len_size + len(header) + 1
    text = header + " " * (-unpadded % 64) + "\n"
    size = struct.pack("<H" if major == 1 else "<I", len(text))
    return b"\x93NUMPY" + bytes([major, 0]) + size + text.encode() + data


def idx(code, sizes, data):
    return bytes([0, 0, code, len(sizes)]) + b"".join(struct.pack(">I", s) for s in sizes) + data


def gz(data):
    # mtime=0: the same bytes on every run.
    return gzip.compress(data, compresslevel=9, mtime=0)


def write(target, files):
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


def main():
    sift = fvecs_rows("data/siftsmall/siftsmall_base.fvecs", 3)
    query = fvecs_rows("data/siftsmall/siftsmall_query.fvecs", 1)
    truth = fvecs_rows("data/siftsmall/siftsmall_groundtruth.ivecs", 3)
    fmnist = fvecs_rows("data/fmnistsmall/fmnistsmall_base.fvecs", 3)
    tiny = [(2, struct.pack("<2f", 1.5, -2.0)), (2, struct.pack("<2f", 3.0, 4.0))]

    base = texmex(sift[:2])
    write("fvecs", {
        "sift-base-2": base,
        "sift-query-1": texmex(query),
        "tiny-2x2": texmex(tiny),
        "bad-truncated": base[:-3],
        "bad-mixed-dims": texmex(tiny) + texmex([(1, struct.pack("<f", 5.0))]),
        "bad-negative-dim": struct.pack("<i", -5) + bytes(16),
        "bad-huge-dim": struct.pack("<i", 1 << 24) + bytes(8),
    })

    write("ivecs", {
        "sift-groundtruth-3": texmex(truth),
        "tiny-2x2": texmex([(2, struct.pack("<2i", 7, 3)), (2, struct.pack("<2i", 1, 0))]),
        "bad-truncated-header": texmex(truth[:1]) + b"\x64\x00",
        "bad-zero-dim": struct.pack("<i", 0),
    })

    def widen(raw):
        return bytes(int(x) for x in floats(raw))

    bvecs = texmex([(dim, widen(raw)) for dim, raw in sift])
    write("bvecs", {
        "sift-base-3": bvecs,
        "tiny-2x3": texmex([(3, bytes([0, 128, 255])), (3, bytes([1, 2, 3]))]),
        "bad-truncated": bvecs[:-1],
        "bad-mixed-dims": texmex([(3, bytes(3)), (2, bytes(2))]),
    })

    def header(descr, shape, extra=""):
        return "{'descr': '%s', 'fortran_order': False, 'shape': %s, %s}" % (descr, shape, extra)

    sift_f4 = b"".join(raw for _, raw in sift)
    halves = struct.pack("<4e", 0.5, -1.0, 65504.0, 0.1)
    write("npy", {
        "sift-f4-3x128": npy(header("<f4", "(3, 128)"), sift_f4),
        "u1-v2-3x2": npy(header("|u1", "(3, 2)"), bytes([0, 1, 2, 127, 128, 255]), major=2),
        "f2-v3-2x2": npy(header("<f2", "(2, 2)"), halves, major=3),
        "be-f4-1d": npy(header(">f4", "(3,)"), struct.pack(">3f", 1.0, -2.0, 3.5)),
        "be-f2-1x2": npy(header(">f2", "(1, 2)"), struct.pack(">2e", 1.0, 2.0)),
        "variants": npy('{"shape": (2L, 1L), "fortran_order": False, "descr": "<f4"}', struct.pack("<2f", 1, 2)),
        "bad-duplicate-shape": npy(header("<f4", "(1, 2)", "'shape': (2, 2), "), struct.pack("<4f", 1, 2, 3, 4)),
        "bad-extra-key": npy(header("<f4", "(1, 2)", "'extra': 1, "), struct.pack("<2f", 1, 2)),
        "bad-fortran": npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", bytes(16)),
        "bad-truncated": npy(header("<f4", "(2, 3)"), bytes(20)),
        "bad-f8": npy(header("<f8", "(1, 1)"), bytes(8)),
    })

    images = b"".join(widen(raw) for _, raw in fmnist)
    idx_files = {
        "fmnist-images-3x28x28": idx(0x08, [3, 28, 28], images),
        "labels-4": idx(0x08, [4], bytes([9, 0, 0, 3])),
        "f32-2x3": idx(0x0D, [2, 3], struct.pack(">6f", 1.5, -2, 1e-3, 7, 0, -0.0)),
        "bad-magic": b"\x12" + idx(0x08, [1, 1], b"\x00")[1:],
        "bad-truncated": idx(0x08, [2, 2, 3], bytes(11)),
        "bad-type": idx(0x0E, [1, 1], bytes(8)),
        "bad-huge-sizes": idx(0x08, [0xFFFFFFFF] * 3, bytes(16)),
    }
    write("idx", dict(idx_files, **{"gz-labels-4": gz(idx_files["labels-4"])}))

    # idx_gz: the first byte picks the mode (see fuzz_targets/idx_gz.rs). Even: a gzip file
    # follows. Odd: IDX content follows, which the target gzips (0xC1: level 6, one member;
    # 0xD1: two members split at the half; 0xC3: followed by bytes that are no gzip member).
    bomb = gz(idx(0x08, [0xFFFFFFFF, 1], bytes(64 << 10)))
    liar = gz(idx(0x08, [2, 2, 2], bytes(64 << 10)))
    labels = idx_files["labels-4"]
    write("idx_gz", {
        "gz-fmnist-images-3x28x28": b"\x00" + gz(idx_files["fmnist-images-3x28x28"]),
        "gz-f32-2x3": b"\x00" + gz(idx_files["f32-2x3"]),
        "gz-two-members": b"\x00" + gz(labels[:10]) + gz(labels[10:]),
        "raw-labels-4": b"\xc1" + labels,
        "raw-two-members-f32": b"\xd1" + idx_files["f32-2x3"],
        "raw-garbage-after": b"\xc3" + labels,
        "bad-bomb-4GiB-declared": b"\x00" + bomb,
        "bad-liar-8-declared": b"\x00" + liar,
        "bad-not-gzip": b"\x00" + labels,
        "bad-cut": b"\x00" + gz(labels)[:-4],
    })


if __name__ == "__main__":
    main()
