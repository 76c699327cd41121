#!/usr/bin/env bash
# Calls 1-3 carry FAISS GPU 1.15.1 in parts (../shared/tools/faiss-gpu-prep.sh; the tree is 22 MB,
# so a part and a bundle do not fit one call's 64 MiB). Call 1: the first part.
set -eu
mkdir -p /tmp/faiss && cp .faiss/part.aa /tmp/faiss/ && ls -la /tmp/faiss
