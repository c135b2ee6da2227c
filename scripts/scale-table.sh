#!/usr/bin/env bash
# Prints the scale table of docs/scale.md (Markdown): the flat ring against
# the planner's hierarchical layout at 16, 64 and 256 peers, fp32 (codec
# none) buckets standing for 64 MiB, 1 Gbit/s interfaces, 50 ms round trips
# between every pair of peers (and a row with racks of 16 peers 0.2 ms
# apart), each measured in-process over memtransport in virtual time
# (testing/synctest: the network model alone, no CPU time) and predicted by
# the α–β model (allreduce.Model). The clusters larger than 16 peers run with
# the bucket, the rate and the pipeline chunk divided alike (the "÷" in the
# table), which leaves every time unchanged but for the frame headers; 16
# peers run both unscaled and scaled to show it. Progress goes to stderr.
# About 3 CPU-minutes and 4 GB of memory (GOMEMLIMIT below).
set -euo pipefail
cd "$(dirname "$0")/.."
export GOMEMLIMIT="${GOMEMLIMIT:-3GiB}"
# The table's lines go to stdout, everything else go test says to stderr.
P2PTRAIN_SCALE_TABLE=1 go test -v -count=1 -timeout 30m -run '^TestScaleTable$' ./allreduce/allreducebench/ 2>&1 \
  | awk '/^\|/ { print; next } { print > "/dev/stderr" }'
