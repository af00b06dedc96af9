"""The test kit, for this project's tests and soak and for users testing their own jobs
(docs/testing.md): real servers and consumers in subprocesses, a fault-injecting TCP proxy, an S3
fault proxy in front of moto's server (``s3server``), free ports and exactly-once accounting of
audit logs.

    server = ServerProc({"size": 96, "batch_size": 4}).start()   # hetero serve, own process group
    proxy = FaultProxy(("127.0.0.1", server.bulk_port))          # cut(), stall(), delay_s
    ...
    counts = check_audit(audit_path, {"size": 96, "batch_size": 4}, seed=0)
    assert counts["lost"] == counts["duplicated"] == counts["corrupt"] == 0

The rest of the product never imports it (tests/test_layering.py).
"""
from hetero.ports import free_port
from hetero.testing.audit import Reference, account, check_audit, read_audit
from hetero.testing.processes import PIPELINE, TOKEN, ConsumerProc, ServerProc
from hetero.testing.proxy import FaultProxy

__all__ = ["PIPELINE", "TOKEN", "ConsumerProc", "FaultProxy", "Reference", "ServerProc", "account", "check_audit",
           "free_port", "read_audit"]
