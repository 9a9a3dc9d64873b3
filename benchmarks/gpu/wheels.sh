#!/usr/bin/env bash
# The wheels the GPU machine lacks, at requirements.lock's versions, into .whl/ (git-ignored), for
# run.sh to install there: its Python is 3.12 with torch but an older transformers and no Beam.
# Leaves out Beam's MongoDB connector (pymongo, dnspython), which no step imports, so that the
# wheels and the checkout stay under the 64 MiB a device call may carry. Needs PyPI; run it here,
# then name ".whl" in the call's carry.
#
# Usage: bash benchmarks/gpu/wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
packages="transformers regex accelerate psutil apache-beam cryptography cffi fastavro fasteners httplib2 jsonpickle
          objsize proto-plus pytz zstandard beartype pycparser"
pins=()
for p in $packages; do
  pin=$(grep -i "^$p==" requirements.lock) || { echo "wheels: $p is not in requirements.lock" >&2; exit 1; }
  pins+=("$pin")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "${pins[@]}"
wheels=$(du -sb .whl | cut -f1)
checkout=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
awk -v w="$wheels" -v c="$checkout" 'BEGIN {printf "wheels: %.1f MiB in .whl/, checkout %.1f MiB: %.1f of the 64 MiB a call carries\n", w / 2^20, c / 2^20, (w + c) / 2^20}'
