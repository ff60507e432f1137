"""Benchmarks of genrm-grpc: core cost vs retained cohorts, end-to-end gRPC, judge scheduling.

Run with ``make bench`` or ``python -m bench.run [--quick]``; see ``bench/README.md``.
"""
