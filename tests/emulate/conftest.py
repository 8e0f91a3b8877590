"""Emulation tests that build namespaces need root and a kernel with netns, veth and bridges; elsewhere they skip."""
import os

import pytest


@pytest.fixture(scope="session")
def caps():
    """The kernel's abilities, probed once; skips with the reason when emulation cannot run here."""
    from gradwire.emulate import EmulationUnavailable
    from gradwire.emulate.host import check_host, this_run
    from gradwire.emulate.netlink import probe

    if os.geteuid() != 0:
        pytest.skip("emulation needs root (network namespaces, veth pairs, qdiscs)")
    try:
        check_host()
        return probe(this_run())
    except EmulationUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def no_leftovers():
    """After the test: none of this process's namespaces and no prefixed link in the host's namespace remain."""
    from gradwire.emulate import netlink
    from gradwire.emulate.host import this_run

    yield
    mine = [n for n in netlink.namespaces() if n.startswith(f"gw-{this_run()}-")]
    assert mine == [] and netlink.links() == []
