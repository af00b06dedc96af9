"""The emulated NIC benchmark (benchmarks/nic.py) and its link helpers (benchmarks/common/netns.py).

The unit tests need no root: they check the rate scaling, the address choice and the commands
that make and remove a link. The slow test runs the benchmark's smallest configuration in a
network namespace, or skips with the reason where this host cannot make one.
"""
from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from benchmarks.common import netns as _netns
from benchmarks.common.netns import (EmulatedLink, LinkUnavailable, choose_subnet, cleanup_commands,
                                     leftover_owners, names, parse_used_networks, parse_tbf_counters, scaled_rate_bps,
                                     tbf_command, tcp_goodput)

_ROOT = Path(__file__).resolve().parent.parent


def test_rate_is_the_asked_fraction_of_what_the_cores_build():
    # 1,000 images/s per core on 2 cores at 150,528 bytes each: 2.408 Gbit/s built; a quarter of it
    assert scaled_rate_bps(1000, 2, 150_528, 0.25) == pytest.approx(1000 * 2 * 150_528 * 8 / 4)
    assert scaled_rate_bps(500, 1, 1000, 1.0) == 4_000_000


@pytest.mark.parametrize("kwargs, name", [({"per_core_images_s": 0}, "per_core_images_s"),
                                          ({"cores": -1}, "cores"), ({"bytes_per_image": 0}, "bytes_per_image"),
                                          ({"fraction": 0}, "fraction"), ({"fraction": 1.5}, "fraction")])
def test_rate_scaling_names_a_bad_figure(kwargs, name):
    args = dict(per_core_images_s=100, cores=1, bytes_per_image=1000, fraction=0.5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        scaled_rate_bps(**args)


def test_goodput_counts_the_headers_of_every_frame():
    assert tcp_goodput(1500) == pytest.approx(1448 / 1514)
    assert tcp_goodput(9000) > tcp_goodput(1500)
    with pytest.raises(ValueError, match="mtu=40"):
        tcp_goodput(40)


def test_subnet_avoids_every_address_and_route_of_the_host():
    assert choose_subnet([]) == ipaddress.ip_network("10.213.0.0/30")
    # the first two /30s taken by an address, a route covers the next 8 addresses
    used = ["10.213.0.1/30", "10.213.0.6/32", "10.213.0.8/29"]
    assert choose_subnet(used) == ipaddress.ip_network("10.213.0.16/30")
    # the whole 10.213/16 routed elsewhere: the link-local pool
    assert choose_subnet(["10.0.0.0/8"]) == ipaddress.ip_network("169.254.213.0/30")
    with pytest.raises(LinkUnavailable, match="no free /30"):
        choose_subnet(["10.0.0.0/8", "169.254.0.0/16"])


def test_used_networks_come_from_addresses_and_routes_but_not_the_default_route():
    addr = ("1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n"
            "2: eth0    inet 10.213.0.5/24 brd 10.213.0.255 scope global eth0\n")
    routes = ("default via 172.17.0.1 dev eth0\n172.17.0.0/16 dev eth0 proto kernel scope link\n"
              "local 10.213.9.1 dev lo table local proto kernel\nblackhole 10.213.7.0/24\n")
    used = {str(n) for n in parse_used_networks(addr, routes)}
    assert used == {"127.0.0.0/8", "10.213.0.0/24", "172.17.0.0/16", "10.213.9.1/32", "10.213.7.0/24"}
    assert choose_subnet(parse_used_networks(addr, routes)) == ipaddress.ip_network("10.213.1.0/30")


def test_names_fit_the_kernels_interface_name_limit_and_carry_the_owner():
    ns, host_if, ns_if = names(4194304)
    assert (ns, host_if, ns_if) == ("hnic-4194304", "hnic4194304h", "hnic4194304n")
    assert max(len(host_if), len(ns_if)) <= 15
    with pytest.raises(ValueError, match="owner=-1"):
        names(-1)


def test_commands_make_then_remove_exactly_the_owners_link():
    link = EmulatedLink(owner=77, subnet=ipaddress.ip_network("10.213.0.4/30"), rate_bps=300e6)
    cmds = [" ".join(c) for c in link.setup_commands()]
    assert cmds[0] == "ip netns add hnic-77"
    assert "ip link add hnic77h mtu 1500 type veth peer name hnic77n mtu 1500 netns hnic-77" in cmds
    assert "ip addr add 10.213.0.5/30 dev hnic77h" in cmds
    assert "ip netns exec hnic-77 ip addr add 10.213.0.6/30 dev hnic77n" in cmds
    # both directions shaped, the data direction (out of the namespace) inside it
    assert any(c.startswith("ip netns exec hnic-77 tc qdisc replace dev hnic77n root tbf rate 300000000bit")
               for c in cmds)
    assert any(c.startswith("tc qdisc replace dev hnic77h root tbf rate 300000000bit") for c in cmds)
    assert link.cleanup_commands() == cleanup_commands(77) == [["ip", "link", "del", "hnic77h"],
                                                               ["ip", "netns", "del", "hnic-77"]]
    assert link.exec_prefix() == ["ip", "netns", "exec", "hnic-77"]
    assert _netns.namespace_pids_command(77) == ["ip", "netns", "pids", "hnic-77"]


def test_token_bucket_holds_at_least_10_ms_of_the_rate():
    small = tbf_command("x", 8e6)
    big = tbf_command("x", 8e9, netns="ns")
    assert small[small.index("burst") + 1] == str(128 * 1024)
    assert big[:4] == ["ip", "netns", "exec", "ns"] and big[big.index("burst") + 1] == str(10_000_000)
    with pytest.raises(ValueError, match="rate_bps=0"):
        tbf_command("x", 0)


def test_only_the_links_of_gone_processes_are_leftovers():
    netns = "hnic-100 (id: 3)\nhnic-200\nother-ns\nhnic-x\n"
    links = ("5: hnic300h@if4: <BROADCAST> mtu 1500\n6: hnic200h@if2: <BROADCAST> mtu 1500\n"
             "7: eth0: <BROADCAST> mtu 1500\n")
    alive = {200}.__contains__
    assert leftover_owners(netns, links, alive) == [100, 300]


def test_tc_counters_are_read_from_tc_s_qdisc():
    text = ("qdisc tbf 8001: root refcnt 3 rate 400Mbit burst 500000b lat 100ms\n"
            " Sent 907515297 bytes 599489 pkt (dropped 2, overlimits 40668 requeues 0)\n backlog 0b 0p requeues 0\n")
    assert parse_tbf_counters(text) == {"sent": 907515297, "packets": 599489, "dropped": 2, "overlimits": 40668}
    assert parse_tbf_counters("") == {"sent": 0, "packets": 0, "dropped": 0, "overlimits": 0}


def test_an_unprivileged_host_is_told_why(monkeypatch):
    monkeypatch.setattr(_netns.os, "geteuid", lambda: 1000)
    assert "root" in _netns.unavailable()
    monkeypatch.setattr(_netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(_netns.shutil, "which", lambda tool: None if tool == "tc" else "/sbin/" + tool)
    assert "`tc` not found" in _netns.unavailable()
    with pytest.raises(LinkUnavailable, match="tc"):
        EmulatedLink.create(1e8)


def test_prediction_names_what_binds_and_the_step_follows_it():
    from benchmarks.nic import local_prediction, predict

    # 1,000 images/s per core of 150,528 bytes behind 400 Mbit/s: the NIC carries ~318 images/s
    args = dict(preprocess_s=0.032, gpu_step_s=0.02, batch_size=32, bytes_per_sample=150_528, goodput=1.0)
    for model in (lambda **k: local_prediction(node_cores=1, data_nic_gbps=0.4, **k),
                  lambda **k: predict(nic_bps=4e8, **k)):
        nic = model(**args)
        assert nic.binding == "data NIC" and nic.step_s == pytest.approx(32 * 150_528 * 8 / 4e8)
        cores = model(**{**args, "bytes_per_sample": 10_000})
        assert cores.binding == "cores" and cores.step_s == pytest.approx(0.032)
        step = model(**{**args, "bytes_per_sample": 10_000, "gpu_step_s": 0.05})
        assert step.binding == "gpu" and step.step_s == pytest.approx(0.05)


def test_encodings_are_chosen_by_the_image_pipelines_option():
    from benchmarks.nic import available_encodings, encoding_options

    assert encoding_options("uint8") == {}
    assert encoding_options("jpeg:90") == {"wire_encoding": "jpeg:90"}
    ok, left_out = available_encodings(["uint8", "jpeg:90", "nope"])
    assert ok == ["uint8", "jpeg:90"] and "nope" in left_out["nope"]


@pytest.mark.slow
@pytest.mark.serial
def test_the_smallest_emulated_nic_run(tmp_path):
    """Two short jobs behind a shaped veth: uint8 bound by the NIC, jpeg:90 with at most a quarter
    of its bytes and not; the live advice runs through both; nothing the run made is left behind."""
    import json
    import subprocess
    import sys

    reason = _netns.unavailable()
    if reason:
        pytest.skip(f"no emulated NIC here: {reason}")
    out = tmp_path / "nic.json"
    cmd = [sys.executable, "-m", "benchmarks.nic", "--images-dir", str(tmp_path / "photos"), "--images", "64",
           "--steps", "20", "--warmup", "6", "--profile-batches", "1", "--settle-s", "0", "--advice-every", "7",
           "--json", str(out)]
    proc = subprocess.Popen(cmd, cwd=_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        text, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, text[-3000:]
    result = json.loads(out.read_text())
    if "skipped" in result:
        pytest.skip(f"no emulated NIC here: {result['skipped']}")
    ns, host_if, _ = names(proc.pid)
    assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert host_if not in subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    jobs = {j["encoding"]: j for j in result["jobs"]}
    u8, jpeg = jobs["uint8"], jobs["jpeg:90"]
    assert u8["predicted"]["binding"] == "data NIC", text[-3000:]
    assert jpeg["predicted"]["binding"] != "data NIC", text[-3000:]
    assert jpeg["bytes_per_image"] <= u8["bytes_per_image"] / 4
    assert u8["link"]["sent"] > 0 and u8["step_s"] > jpeg["step_s"]
    # The live advice ran through both jobs and named what binds; jpeg:90 uses a quarter of the link
    # at most, so never the NIC. (That it names the NIC for uint8 needs the servers up for the
    # advice's trusted uptime, 60 s, before the window: the full run checks it, advice_names_nic.)
    assert u8["advice"] and jpeg["advice"]
    unnamed = [line for line in u8["advice"] + jpeg["advice"] if "bound by" not in line]
    assert not unnamed, unnamed  # only the lines that name nothing: a long list's middle is cut in the report
    assert not any("NIC binds" in line for line in jpeg["advice"]), jpeg["advice"]


def test_the_benchmark_skips_with_the_reason_where_it_cannot_make_a_link(tmp_path, monkeypatch, capsys):
    import json

    from benchmarks import nic

    monkeypatch.setattr(nic, "unavailable", lambda: "needs root (network namespaces, veth and tc)")
    assert nic.main(["--json", str(tmp_path / "nic.json")]) == 0
    result = json.loads((tmp_path / "nic.json").read_text())
    assert result["skipped"] == "needs root (network namespaces, veth and tc)"
    assert "benchmarks.nic skipped: needs root" in capsys.readouterr().out


def test_a_step_that_fails_leaves_nothing_behind():
    import os
    import subprocess

    if _netns.unavailable():
        pytest.skip(f"no emulated NIC here: {_netns.unavailable()}")
    owner = os.getpid()
    with pytest.raises(LinkUnavailable, match="ip link add"):
        EmulatedLink.create(1e8, owner=owner, mtu=1 << 20)  # no veth takes a 1 MiB MTU: the second step fails
    ns, host_if, _ = names(owner)
    assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert host_if not in subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
