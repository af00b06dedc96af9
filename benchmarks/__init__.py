"""Benchmarks: price table, cost arithmetic and benchmark drivers."""
