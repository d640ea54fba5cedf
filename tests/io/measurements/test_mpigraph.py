"""mpiGraph output parsing (fixtures in mpiGraph.c's exact layout)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipette_cp.errors import InputFileError
from pipette_cp.io.measurements.mpigraph import parse_mpigraph, read_mpigraph
from pipette_cp.units import MiB
from tests.conftest import FIXTURES

FIX = FIXTURES / "mpigraph"


def test_four_nodes_orientation_and_units():
    result = read_mpigraph(FIX / "mpigraph_4nodes.txt")
    assert result.labels == ("gpu01:0", "gpu02:1", "gpu03:2", "gpu04:3")
    assert result.node_names == ("gpu01", "gpu02", "gpu03", "gpu04")
    assert (result.message_size_bytes, result.times, result.window) == (4194304, 10, 50)
    send, recv = result.send_bytes_per_s, result.recv_bytes_per_s
    # "gpu02:1 to ... 12537.334" (column gpu04): gpu02 -> gpu04 timed at the sender
    assert send[1, 3] == pytest.approx(12537.334 * MiB)
    # "gpu04:3 from ... 12480.512" (column gpu02): gpu02 -> gpu04 timed at the receiver
    assert recv[1, 3] == pytest.approx(12480.512 * MiB)
    assert recv[3, 1] == pytest.approx(22390.690 * MiB)  # the other direction is healthy
    assert np.diagonal(recv).tolist() == [0.0] * 4
    assert result.rank_matrix() is recv
    assert result.rank_matrix("send") is send
    node = result.node_matrix()
    np.testing.assert_allclose(node, recv)  # one rank per host: node matrix = rank matrix
    assert not recv.flags.writeable


def test_two_ranks_per_host_are_averaged():
    result = read_mpigraph(FIX / "mpigraph_2hosts_2ranks.txt")
    assert result.hosts == ("nodeA", "nodeA", "nodeB", "nodeB")
    node = result.node_matrix("recv")
    assert node.shape == (2, 2)
    # nodeA -> nodeB: ranks 0,1 -> 2,3 = mean(20000, 22000, 24000, 18000) MiB/s
    assert node[0, 1] == pytest.approx(21000 * MiB)
    # nodeB -> nodeA: ranks 2,3 -> 0,1 = mean(21000, 23000, 19000, 25000)
    assert node[1, 0] == pytest.approx(22000 * MiB)
    assert node[0, 0] == 0.0


def test_zero_entry_is_a_failed_pair_and_excluded_from_the_mean():
    text = (FIX / "mpigraph_2hosts_2ranks.txt").read_text()
    text = text.replace("nodeB:2 from\t20000.000", "nodeB:2 from\t0.000")
    assert "nodeB:2 from\t0.000" in text
    node = parse_mpigraph(text).node_matrix()
    assert node[0, 1] == pytest.approx((22000 + 24000 + 18000) / 3 * MiB)
    with pytest.raises(ValueError, match="direction"):
        parse_mpigraph(text).rank_matrix("both")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.split("\nRecv max")[0], "no Recv table"),
        (lambda t: "hello\n", "no Send or Recv table"),
        (lambda t: t.replace("gpu03:2 to\t", "gpu03:2 to\tx\t", 1), "non-numeric"),
        (
            lambda t: t.replace("gpu04:3 to\t22712.310\t", "gpu04:3 to\t", 1),
            r"4 rows of \[3, 4\] values",
        ),
        (lambda t: t.replace("\ngpu02:1 to", "\ngpu09:1 to", 1), "out of order"),
        (
            lambda t: t.replace("Recv\tgpu01:0", "Recv\tgpu05:0").replace(
                "gpu01:0 from", "gpu05:0 from"
            ),
            "different ranks",
        ),
    ],
)
def test_malformed_output(edit, message):
    text = edit((FIX / "mpigraph_4nodes.txt").read_text())
    with pytest.raises(InputFileError, match=message):
        parse_mpigraph(text)


def test_missing_file(tmp_path: Path):
    with pytest.raises(InputFileError, match="no such file"):
        read_mpigraph(tmp_path / "mpiGraph.out")
