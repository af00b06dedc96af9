"""The ``hetero`` command line and job-level tools (local cluster, benchmarks, submission)."""
