#!/usr/bin/env python3
"""Writes a copy of a hive-gpu collection file without its payload index section (kind 9), as
the format version the remaining sections need (docs/FORMAT.md): the file a build before
format 4 wrote for the same collection. Used to measure, with one build and one file, what
opening with the stored payload index saves against building it (examples/payload_open.rs,
docs/PERFORMANCE.md).

    python3 scripts/strip_payload_index.py IN.hgc OUT.hgc

Only a file whose payload index is its last section is handled (a save writes it last unless
the collection has an index or is a shard).
"""

import struct
import sys


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), bit by bit: only the header and table, a few hundred bytes."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def main(src: str, dst: str) -> None:
    with open(src, "rb") as f:
        head = bytearray(f.read(64))
        count = struct.unpack_from("<I", head, 16)[0]
        table = bytearray(f.read(40 * count))
    entries = [table[i * 40:(i + 1) * 40] for i in range(count)]
    kinds = [struct.unpack_from("<I", e, 0)[0] for e in entries]
    if 9 not in kinds:
        sys.exit(f"{src} has no payload index section")
    victim = entries[kinds.index(9)]
    offset, length = struct.unpack_from("<QQ", victim, 8)
    file_bytes = struct.unpack_from("<Q", head, 24)[0]
    if offset + length != file_bytes:
        sys.exit("the payload index is not the file's last section")
    kept = [e for e, k in zip(entries, kinds) if k != 9]
    version = 3 if 8 in kinds else 2 if 7 in kinds else 1
    new_table = b"".join(kept)
    struct.pack_into("<I", head, 8, version)
    struct.pack_into("<I", head, 16, len(kept))
    struct.pack_into("<Q", head, 24, offset)
    struct.pack_into("<I", head, 56, crc32c(new_table))
    struct.pack_into("<I", head, 60, crc32c(bytes(head[:60])))
    with open(src, "rb") as f, open(dst, "wb") as out:
        out.write(head)
        out.write(new_table)
        out.write(b"\0" * 40)  # the dropped entry's bytes: padding now, which must be zero
        f.seek(64 + 40 * count)
        left = offset - (64 + 40 * count)
        while left > 0:
            chunk = f.read(min(left, 64 << 20))
            out.write(chunk)
            left -= len(chunk)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
