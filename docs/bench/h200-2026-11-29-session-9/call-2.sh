#!/usr/bin/env bash
# Call 2: FAISS's second part.
set -eu
cp .faiss/part.ab /tmp/faiss/ && ls -la /tmp/faiss
