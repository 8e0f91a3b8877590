import argparse
import pathlib

import pytest

import gradwire.net
from gradwire.cli import net as net_cli


def run(argv, capsys):
    parser = argparse.ArgumentParser(prog="gradwire")
    net_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr().out


def test_describe_prints_every_field_and_a_table(capsys):
    code, out = run(["net", "describe", "10gbe,latency=200us", "-n", "2", "4", "--sizes", "4KiB", "16MiB"], capsys)
    assert code == 0
    for field in ("bandwidth", "latency", "protocol", "jitter_dist", "loss", "algorithm", "topology",
                  "intra_bandwidth", "clock", "seed", "stragglers"):
        assert field in out
    assert "10gbe,latency=200us" in out and "200 us" in out
    assert "world size 2" in out and "world size 4" in out
    assert "all_reduce" in out and "barrier" in out and "busbw" in out and "16 MiB" in out


def test_describe_ops_filter(capsys):
    code, out = run(["net", "describe", "ib-hdr,topology=2x4,intra=nvlink", "--ops", "all_reduce"], capsys)
    assert code == 0 and "hierarchical" in out and "all_gather" not in out


def test_a_bad_spec_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        run(["net", "describe", "10gbe,latency=5"], capsys)
    assert "no unit" in capsys.readouterr().err


def test_bad_size_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        run(["net", "describe", "10gbe", "--sizes", "1q"], capsys)
    assert "unknown size unit" in capsys.readouterr().err


def test_presets(capsys):
    code, out = run(["net", "presets"], capsys)
    assert code == 0
    for name in gradwire.net.PRESETS:
        assert name in out


def test_net_alone_prints_help(capsys):
    code, out = run(["net"], capsys)
    assert code == 2 and "describe" in out


def test_the_model_does_not_import_torch():
    # gradwire.net must stay a pure model: no torch, no torch.distributed
    root = pathlib.Path(gradwire.net.__file__).parent
    for path in [*root.glob("*.py"), pathlib.Path(net_cli.__file__)]:
        text = path.read_text()
        assert "import torch" not in text and "from torch" not in text, path
