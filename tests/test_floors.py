"""The CPU floors benchmarks/dataplane.py prints beside the data plane's figures."""
import pytest

from benchmarks.floors import raw_tcp_cpu, round_trip_cpu


def test_raw_tcp_floor_moves_whole_messages_and_reports_both_ends():
    got = raw_tcp_cpu(1 << 16, 0.3)
    assert got["size"] == 1 << 16 and got["per_s"] > 0
    assert got["total_ms"] == pytest.approx(got["sender_ms"] + got["receiver_ms"]) and got["total_ms"] >= 0


def test_round_trip_floor_reports_both_ends():
    got = round_trip_cpu(0.3)
    assert got["per_s"] > 0
    assert got["total_ms"] == pytest.approx(got["waiter_ms"] + got["replier_ms"]) and got["total_ms"] >= 0
