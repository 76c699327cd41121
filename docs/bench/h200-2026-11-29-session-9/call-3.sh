#!/usr/bin/env bash
# Call 3: FAISS's last part and its runtime wheel, assembled; and the CLI of 0845a1c (the GPU code
# before this session, taken from session 8's bundle) unpacked to /tmp/old for the A/B of call 5.
set -eu
cp .faiss/part.ac .faiss/*.whl /tmp/faiss/ && bash .faiss/device-setup.sh
mkdir -p /tmp/old && tar -xJf .carry/old-cli.tar.xz -C /tmp/old && /tmp/old/hive-gpu --version
