"""The emulated NIC benchmark (benchmarks/nic.py) and its link helpers (benchmarks/_netns.py).

The unit tests need no root: they check the rate scaling, the address choice and the commands
that make and remove a link. The slow test runs the benchmark's smallest configuration in a
network namespace, or skips with the reason where this host cannot make one.
"""
from __future__ import annotations

import ipaddress

import pytest

from benchmarks import _netns
from benchmarks._netns import (EmulatedLink, LinkUnavailable, choose_subnet, cleanup_commands, leftover_owners,
                               names, parse_used_networks, scaled_rate_bps, tbf_command, tcp_goodput)


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


def test_an_unprivileged_host_is_told_why(monkeypatch):
    monkeypatch.setattr(_netns.os, "geteuid", lambda: 1000)
    assert "root" in _netns.unavailable()
    monkeypatch.setattr(_netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(_netns.shutil, "which", lambda tool: None if tool == "tc" else "/sbin/" + tool)
    assert "`tc` not found" in _netns.unavailable()
    with pytest.raises(LinkUnavailable, match="tc"):
        EmulatedLink.create(1e8)
