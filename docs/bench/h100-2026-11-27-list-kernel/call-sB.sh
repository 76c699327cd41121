#!/usr/bin/env bash
# FAISS part 2.
set -u
cp .faiss/part.ab /tmp/faiss/ && echo copied
