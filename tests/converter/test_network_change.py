"""whatif --bandwidth / --latency / --network (converter/network_change.py): a network change
through the network fitted to the run's transfers, not a flat factor."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from chakra_hooks.cli import cli
from chakra_hooks.convert import convert_paths
from chakra_hooks.converter import network_change as nets
from chakra_hooks.converter import peers as run_peers
from chakra_hooks.converter.targets.astra_sim import network as fitting
from chakra_hooks.linker.model import CommType

DLRM = "pytorch/v100_dlrm_8rank"


@pytest.fixture(scope="module")
def dlrm(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("dlrm")
    convert_paths([corpus / DLRM], out, progress=False, warn=lambda _: None)
    astra = tmp_path_factory.mktemp("dlrm_astra")
    convert_paths([corpus / DLRM], astra, target="astra-sim", progress=False,
                  warn=lambda _: None)
    return out, astra


def _factors(links, samples, change):
    run = nets.RunNetwork(links, {d: 1 for d in links},
                          {(i, i): s for i, s in enumerate(samples)}, 1)
    return run.factors(change)[0]


def test_bandwidth_moves_only_the_bandwidth_term():
    """On a network of 1 GB/s and 100 us per latency term, an all-reduce of 1 KB is latency
    (twice the bandwidth: the same time within 0.1 %), one of 1 GB bandwidth (half)."""
    link = {nets.WITHIN: nets.Link(1.0, 100_000)}
    small = (nets.WITHIN, fitting.Sample(CommType.ALL_REDUCE, 1024, 4, 0.0))
    big = (nets.WITHIN, fitting.Sample(CommType.ALL_REDUCE, 1 << 30, 4, 0.0))
    got = _factors(link, [small, big], nets.NetworkChange({None: 2.0}))
    assert got[(0, 0)] == pytest.approx(1.0, abs=0.001)
    assert got[(1, 1)] == pytest.approx(0.5, abs=0.01)
    latency = _factors(link, [small, big], nets.NetworkChange(latency={None: ("=", 0.0)}))
    assert latency[(0, 0)] < 0.01 and latency[(1, 1)] == pytest.approx(1.0, abs=0.01)


def test_two_tiers_between_hosts_bounded_by_within():
    """Dimension 1 made 10x faster: a collective between hosts is then bounded by the links
    within a host (a ring crosses both); one within a host does not move."""
    links = {nets.WITHIN: nets.Link(2.0, 0.0), nets.ACROSS: nets.Link(1.0, 0.0)}
    inside = (nets.WITHIN, fitting.Sample(CommType.ALL_REDUCE, 1 << 30, 2, 0.0))
    across = (nets.ACROSS, fitting.Sample(CommType.ALL_REDUCE, 1 << 30, 4, 0.0))
    run = nets.RunNetwork(links, {0: 1, 1: 1}, {(0, 0): inside, (1, 1): across}, 2)
    got, notes = run.factors(nets.NetworkChange({nets.ACROSS: 10.0}))
    assert got[(0, 0)] == pytest.approx(1.0)
    assert got[(1, 1)] == pytest.approx(0.5, rel=0.01)
    assert any("bounded by the links within" in n for n in notes)


@pytest.mark.parametrize("flag, value, expected", [
    ("--bandwidth", "2x", {None: ("x", 2.0)}),
    ("--bandwidth", "1=0.5", {1: ("x", 0.5)}),
    ("--latency", "0=2us", {0: ("=", 2000.0)}),
    ("--latency", "500ns", {None: ("=", 500.0)}),
])
def test_parse(flag, value, expected):
    assert nets.parse_dimension_values(flag, [value], flag == "--latency") == expected


@pytest.mark.parametrize("flag, value, says", [
    ("--bandwidth", "2=2x", "dimension '2'"), ("--bandwidth", "0x", "above 0"),
    ("--latency", "fastus", "a latency such as"), ("--bandwidth", "fast", "duration factor"),
])
def test_parse_refuses(flag, value, says):
    with pytest.raises(ValueError, match=says):
        nets.parse_dimension_values(flag, [value], flag == "--latency")


def test_network_file_checked(tmp_path):
    text = "topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50 ]\nlatency: [ 500 ]\n"
    good = tmp_path / "net.yml"
    good.write_text(text)
    assert nets.read_network_file(good, 8) == (nets.Link(50.0, 500.0),)
    two = tmp_path / "two.yml"  # a file left at another run's size ran 2 of 4 NPUs, exit 0
    two.write_text(text.replace("[ 8 ]", "[ 2 ]"))
    with pytest.raises(ValueError, match=r"two.yml: npus_count: 8 NPUs in all.*got 2 = 2"):
        nets.read_network_file(two, 8)
    bad = tmp_path / "bad.yml"
    bad.write_text("bandwidth: 5\n")
    with pytest.raises(ValueError, match="bad.yml"):
        nets.read_network_file(bad, 8)


def test_dlrm_fit_is_the_astra_sim_targets(dlrm):
    """whatif fits the network convert --target astra-sim writes (the same transfers), so that
    --bandwidth and ASTRA-sim with the file's bandwidth changed model one network; and
    --network with that file changes nothing."""
    full, astra = dlrm
    ranks, groups, world = run_peers.read_run(sorted(full.glob("*.et")))
    fitted = nets.fit_run(ranks, run_peers.analyse(ranks, groups, world), groups, world)
    text = (astra / "astra_network.yml").read_text()
    bandwidth = float(text.split("bandwidth: [ ")[1].split(" ]")[0])
    latency = float(text.split("latency: [ ")[1].split(" ]")[0])
    assert list(fitted.links) == [nets.WITHIN]
    assert fitted.links[0].bandwidth_gbps == pytest.approx(bandwidth, rel=0.02)
    assert fitted.links[0].latency_ns == pytest.approx(latency, rel=0.02)
    runner = CliRunner()
    same = runner.invoke(cli, ["whatif", str(full), "--network", str(astra / "astra_network.yml"),
                               "--json"])
    assert same.exit_code == 0, same.output
    run = json.loads(same.output.splitlines()[-1])["run"]
    assert run["predicted_us"] == pytest.approx(run["replayed_us"], rel=0.001)
    assert run["network_fitted"]["0"]["transfers"] == fitted.fitted_to[0]
    faster = runner.invoke(cli, ["whatif", str(full), "--bandwidth", "4x"])
    assert faster.exit_code == 0 and "bandwidth x4" in faster.output
    assert "network fitted to the run's transfers" in faster.output
    both = runner.invoke(cli, ["whatif", str(full), "--bandwidth", "4x", "--network",
                               str(astra / "astra_network.yml")])
    assert both.exit_code == 1 and "give one or the other" in both.output
    wrong = astra.parent / "wrong.yml"
    wrong.write_text(text.replace("npus_count: [ 8 ]", "npus_count: [ 2 ]"))
    refused = runner.invoke(cli, ["whatif", str(full), "--network", str(wrong)])
    assert refused.exit_code == 1 and "8 NPUs in all" in refused.output
    assert len(refused.output.strip().splitlines()) == 1


def test_a_recording_that_cannot_tell_latency_from_bandwidth_says_so():
    """Transfers no slower for being larger: the fit gives bandwidth all but 500 ns (so that a
    bandwidth change still moves them), and a bandwidth what-if says it could not tell."""
    samples = [fitting.Sample(CommType.ALL_REDUCE, s, 4, 1e6) for s in (2**20, 2**22, 2**24)]
    assert not fitting.fit(samples).split
    assert fitting.fit([fitting.Sample(CommType.ALL_REDUCE, s, 4, 1e3 + s / 10)
                        for s in (2**20, 2**22, 2**24)]).split
    run = nets.RunNetwork({0: nets.Link(1.0, 500.0)}, {0: 3},
                          {(0, 0): (0, samples[0])}, 1, (0,))
    _, notes = run.factors(nets.NetworkChange({None: 2.0}))
    assert any("does not tell latency from bandwidth" in n for n in notes), notes
    _, quiet = run.factors(nets.NetworkChange(latency={None: ("x", 2.0)}))
    assert not any("does not tell" in n for n in quiet)


def test_no_bound_from_a_dimension_whose_bandwidth_was_not_told_apart():
    """Dimension 0 fitted to one size only (its time all given to bandwidth) says nothing of
    its links' rate: it does not bound dimension 1 made faster."""
    links = {nets.WITHIN: nets.Link(2.0, 500.0), nets.ACROSS: nets.Link(1.0, 0.0)}
    across = (nets.ACROSS, fitting.Sample(CommType.ALL_REDUCE, 1 << 30, 4, 0.0))
    run = nets.RunNetwork(links, {0: 1, 1: 1}, {(1, 1): across}, 2, (nets.WITHIN,))
    got, notes = run.factors(nets.NetworkChange({nets.ACROSS: 10.0}))
    assert got[(1, 1)] == pytest.approx(0.1, rel=0.01)
    assert not any("bounded" in n or "does not tell" in n for n in notes), notes
