"""checkpointd's benchmark harness: ``python -m benchmarks --size quick|full``.

Every number it prints is a ratio measured beside a peer (restic, borg, git,
tar | zstd) or a floor (find, cat, b3sum, cp -a, tar | tar) on the same files in
the same run. Kept import-free so the per-run subprocess (``benchmarks.runner``)
starts as fast as the engine allows.
"""
