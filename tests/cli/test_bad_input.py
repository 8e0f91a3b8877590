"""Bad invocations of every command: refused before any work, one line, exit code 2, no traceback.

Most run in this process through ``main(argv)``; nothing may start: the
launcher and subprocesses are replaced by a function that fails the test, so a
case that is not refused fails at once instead of training for minutes. A few
run as real processes, the way a user meets them.
"""
import json
import shlex
import subprocess
import sys

import pytest

from gradwire.cli.main import main

BIG = "1" * 120_000  # a 120,000-digit number


def _files(tmp):
    """Paths the corpus refers to: an existing file, an existing folder, profile files good and bad."""
    afile = tmp / "afile"
    afile.write_text("x")
    folder = tmp / "folder"
    folder.mkdir()
    (tmp / "notjson.json").write_text("{profiles: nope")
    (tmp / "nokey.json").write_text(json.dumps({"net": "1gbe"}))
    (tmp / "short.json").write_text(json.dumps({"profiles": {"sync": {"name": "sync"}}}))
    good = {"name": "m", "forward": 0.01, "backward": 0.02, "optimizer": 0.001,
            "buckets": [{"nbytes": 4000000, "ready": 0.02}]}
    (tmp / "negative.json").write_text(json.dumps({"profiles": {"sync": dict(good, forward=-1)}}))
    (tmp / "badbucket.json").write_text(json.dumps({"profiles": {"sync": dict(good, buckets=[
        {"nbytes": -1, "ready": 0.0}])}}))
    (tmp / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    (tmp / "badaccumulate.json").write_text(json.dumps({"profiles": {"sync": dict(good, accumulate=0)}}))
    nosync = tmp / "nosync"  # a profile whose every backward ran under no_sync(): no step synchronised
    nosync.mkdir()
    step = {"forward": 0.01, "backward": 0.02, "backward_wait": 0.0, "after_backward": 0.0, "waited": 0.0,
            "optimizer": 0.001, "step": 0.031, "micro_steps": 2, "micro_seconds": [0.03], "buckets": [],
            "collectives": []}
    for rank in range(2):
        (nosync / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "steps": [step] * 6}))
    (tmp / "models.py").write_text("from torch import nn\n\ndef empty():\n    return nn.Sequential(nn.ReLU())\n\n"
                                   "def broken():\n    return nn.Linear()\n")
    from gradwire.device.recorded import write_recording

    recording = {"device": {"name": "cpu", "kind": "cpu", "description": "a CPU", "base": "cpu-core"},
                 "world_size": 2, "model": {"hash": "0" * 16, "parameters": 1, "tensors": 1}, "scale": 1.0,
                 "overhead": 0.0, "roofline_ratio": 1.0, "ops": []}
    write_recording(tmp / "rec", "cpu", recording)  # device=profile:DIR: a recording of another model, 2 ranks
    write_recording(tmp / "two", "cpu", recording)
    write_recording(tmp / "two", "nvidia-h100", recording)
    (tmp / "corrupt" / "ops").mkdir(parents=True)
    (tmp / "corrupt" / "ops" / "cpu.json").write_text("{ops: [")
    return {"FILE": str(afile), "DIR": str(folder), "TMP": str(tmp)}


# (argv, what the one line must mention); {FILE}, {DIR} and {TMP} stand for real paths
CORPUS = [
    # the simulated clock's devices
    ("compare --device a1000", "unknown device 'a1000': use one of cpu-core, t4, v100, a100, h100"),
    ("compare --device host:x0", "the factor must be a positive finite number"),
    ("compare --device 0,1555", "a custom device is TFLOPS/GBps, both positive"),
    ("compare --clock wall", "invalid choice: 'wall'"),
    ("compare --net 1gbe,clock=sim,device=a1000", "unknown device 'a1000'"),
    ("bench --net 1gbe,clock=sim,device=step:35ms", "scales compute by a training step"),
    ("bench --net 1gbe,device=a100", "add clock=sim"),
    # a device recorded by gradwire profile --ops (device=profile:DIR)
    ("compare --device profile:{TMP}/nope", "no such folder; record one with gradwire profile --ops"),
    ("compare --device profile:{FILE}", "is not a folder"),
    ("compare --device profile:{DIR}", "holds no ops/<device>.json"),
    ("compare --device profile:{TMP}/corrupt", "is not a JSON recording (corrupt?)"),
    ("compare --device profile:{TMP}/rec@h100", "the profile holds no recording on h100; it holds cpu"),
    ("compare --net 1gbe,clock=sim,device=profile:{TMP}/two", "holds recordings of cpu, nvidia-h100; name one"),
    ("compare --workers 4 --device profile:{TMP}/rec", "was recorded on 2 ranks and this job has 4"),
    ("compare --workers 2 --device profile:{TMP}/rec", "was recorded on another model"),
    ("bench --clock sim --device profile:{TMP}/rec", "prices a recorded model's ops"),
    ("profile --net clock=sim,device=profile:{TMP}/two@tpu -- true", "holds no recording on tpu"),
    ("profile --ops --ops-steps 0 -- true", "--ops-steps"),
    # bench on the simulated clock
    ("bench --clock wall", "invalid choice: 'wall' (choose from 'sim', 'realtime')"),
    ("bench --device a1000", "unknown device 'a1000'"),
    ("bench --device a100 --clock realtime", "use --clock sim, or leave --device out"),
    ("bench --clock sim --backend nccl", "use --backend gradwire (or leave --backend out)"),
    ("bench --device cpu --tensors cuda", "--device cpu is the old spelling of --tensors"),
    ("bench --device step:35ms", "scales compute by a training step"),
    ("bench --tensors tpu", "invalid choice: 'tpu'"),
    # compare
    ("compare --out /proc/x", "not writable"),
    ("compare --out {FILE}", "is a file, not a folder"),
    ("compare --out {FILE}/sub", "is a file, not a folder"),
    ("compare --seeds 0", "--seeds"),
    ("compare --workers 1", "from 2 to 16"),
    ("compare --workers 20", "from 2 to 16 for the bundled models"),
    ("compare --epochs 0", "--epochs"),
    ("compare --batch-size abc", "expected an integer"),
    ("compare --strategies sync,bogus", "valid strategies"),
    ("compare --strategies onebit:correct=2", "correct must be 0 (every rank applies the same average) or 1"),
    ("compare --strategies signum:correct=1", "correct=1 needs error feedback and an average"),
    ("compare --strategies onebit:correct=1+delayed", "correct=1 is the local correction of sync's DDP hook"),
    ("compare --strategies sync,onebit:ef=150", "ef is the percent of the residual"),
    ("compare --model resnet", "valid models"),
    ("compare --lr -1", "--lr must be > 0"),
    ("compare --target 2", "--target must be in (0, 1]"),
    ("compare --net 10gbe,speed=1", "unknown spec key 'speed'"),
    ("compare --net wan,transport=mpi", "unknown transport 'mpi'; valid: auto, gloo, nccl"),
    ("compare --net wan,transport=nccl,nccl_channels=0", "nccl_channels must be a whole number of channels"),
    ("compare --net 1gbe,topology=2x4 --workers 3", "topology 2x4 holds 8 ranks"),
    ("compare --tolerance 2%", "expected loss=SHARE and/or accuracy=POINTS, got '2%'"),
    ("compare --tolerance loss=1pt", "loss=1pt: expected a share of the baseline's loss from 0% to 100%"),
    ("compare --tolerance loss=150%", "from 0% to 100%, such as 2% or 0.02"),
    ("compare --tolerance accuracy=1%", "accuracy=1%: expected points from 0pt to 100pt, such as 1pt"),
    ("compare --tolerance accuracy=0.01", "such as 1pt or 0.5pt"),
    ("compare --tolerance acc=1pt", "got 'acc=1pt' (e.g. --tolerance loss=2%,accuracy=1pt"),
    ("compare --tolerance loss=1%,loss=2%", "loss is given twice"),
    # compare -- CMD (a script of the user's own)
    ("compare --model cnn -- python x.py", "only for the bundled models"),
    ("compare --epochs 3 --lr 0.1 -- python x.py", "--epochs, --lr: only for the bundled models"),
    ("compare --adam-warmup 5", "only for a command of your own"),
    ("compare --metric loss", "only for a command of your own"),
    ("compare --adam-warmup 0 -- python x.py", "must be an integer >= 1"),
    ("compare --workers 2 -- torchrun --nproc-per-node 2 t.py", "--workers starts the ranks itself"),
    ("compare --workers 99 -- python x.py", "from 1 to 64"),
    ("compare --timeout 0 -- python x.py", "finite number of seconds > 0"),
    ("compare -- /nonexistent/cmd", "no such file"),
    ("compare -- no-such-command-gradwire", "no such command on PATH"),
    ("compare --", "no command after --"),
    ("compare bogus", "unrecognized arguments: bogus"),
    ("compare --strategies sync,bogus -- python x.py", "valid strategies"),
    ("compare --tolerance loss=-1% -- python x.py", "loss=-1%: expected a share"),
    ("compare --net 1gbe,topology=2x4 -- torchrun --nproc-per-node 3 t.py", "topology 2x4 holds 8 ranks"),
    # profile
    ("profile --out /proc/x -- true", "not writable"),
    ("profile --out {FILE} -- true", "is a file, not a folder"),
    ("profile -- /nonexistent/cmd", "no such file"),
    ("profile -- no-such-command-gradwire", "no such command on PATH"),
    ("profile -- {DIR}", "not an executable"),
    ("profile --net 1gbe", "no command after --"),
    ("profile --net bogus -- true", "unknown preset 'bogus'"),
    # predict
    ("predict --profiles /nonexistent.json", "does not exist"),
    ("predict --profiles {DIR}", "is a folder"),
    ("predict --profiles {TMP}/notjson.json", "is not JSON"),
    ("predict --profiles {TMP}/binary.json", "not a text file"),
    ("predict --profiles {TMP}/nokey.json", 'no "profiles" object'),
    ("predict --profiles {TMP}/short.json", "profile 'sync' is not a step profile"),
    ("predict --profiles {TMP}/negative.json", "forward seconds must be a finite number >= 0"),
    ("predict --profiles {TMP}/badbucket.json", "bucket nbytes must be an int >= 0"),
    ("predict --profiles {TMP}/badaccumulate.json", "accumulate (micro-steps per optimizer step) must be"),
    ("predict --accumulate 0", "--accumulate must be an integer >= 1 (micro-steps per optimizer step"),
    ("predict --accumulate 2.5", "--accumulate must be an integer >= 1"),
    ("predict --profile {TMP}/nosync", "no step synchronised its gradients"),
    ("predict --worlds 1", "world sizes >= 2"),
    ("predict --device warp9", "unknown device 'warp9'"),
    ("predict --device step:35ms", "scales a training that runs; predict prices a device"),
    ("predict --device host:x2", "is this host's clock, not a device model: use --device host"),
    ("predict --device 0/1555", "a custom device is TFLOPS/GBps, both positive"),
    ("predict --codec-device cpu", "--codec-device times compression on this host; it goes with --device host"),
    ("predict --worlds 2,x", "comma-separated integers"),
    ("predict --measure-world 1", "--measure-world"),
    ("predict --steps 2", "--steps"),
    ("predict --json /proc/x/p.json", "not writable"),
    ("predict --plot {FILE}/x.png", "is a file, not a folder"),
    ("predict --strategies bogus", "valid strategies"),
    ("predict --net topology=2x4 --worlds 4,6", "world size 6 does not fit nodes of 4 ranks"),
    ("predict --net 10gbe,topology=auto", "topology=auto"),
    ("predict --model no_such_package_gw.models:net --compute-ms 10", "cannot import 'no_such_package_gw.models'"),
    ("predict --model {TMP}/models.py:empty --compute-ms 10", "has no trainable parameters"),
    ("predict --model {TMP}/models.py:broken --compute-ms 10", "building the model on the meta device failed"),
    ("predict --model {TMP}/models.py:nothing --compute-ms 10", "has no attribute 'nothing'"),
    ("predict --model {TMP}/nofile.py:net --compute-ms 10", "no such file"),
    ("predict --model {TMP}/models.py:empty", "give --compute-ms"),
    ("predict --model tiny --compute-ms 0", "--compute-ms must be in (0"),
    ("predict --model tiny --compute-ms -5", "--compute-ms must be in (0"),
    ("predict --model tiny --compute-ms nan", "--compute-ms must be in (0"),
    ("predict --target-efficiency 1.5", "--target-efficiency must be in (0, 1]"),
    ("predict --bucket-cap-mb 0", "--bucket-cap-mb must be in (0"),
    ("predict --input-shape 3,x,224", "--input-shape must be integers"),
    ("predict --profile {FILE}", "is not a folder"),
    ("predict --profile {DIR}", "holds no profile.json or rank*.json"),
    ("predict --profile {DIR} --profiles {TMP}/short.json", "give one of --profile DIR and --profiles FILE"),
    ("predict --strategies sync,handler", "not a DDP bucket strategy"),
    ("predict --device host --codec-device tpu --model tiny --compute-ms 1", "--codec-device must be cpu or cuda"),
    # bench
    ("bench --timeout -1", "finite number of seconds > 0"),
    ("bench --timeout nan", "finite number of seconds > 0"),
    ("bench --timeout soon", "expected a number of seconds"),
    ("bench --json /proc/x/out.json", "not writable"),
    ("bench --csv {FILE}/x.csv", "is a file, not a folder"),
    ("bench --plot {DIR}", "is a folder; give a file name"),
    ("bench --json ''", "the path is empty"),
    ("bench --world-size 0", "--world-size"),
    ("bench -b 0", "a buffer size must be from 1 byte to 1 PiB"),
    ("bench -b 2M -e 1M", "must not exceed -e"),
    ("bench -f 1", "-f (size factor) must be > 1"),
    ("bench -n 0", "-n (iterations) must be >= 1"),
    ("bench -d bogus", "unknown dtype 'bogus'"),
    ("bench -o avg -d int32", "needs a floating point dtype"),
    ("bench --op bogus", "unknown collective 'bogus'"),
    ("bench --backend bogus", "unknown backend 'bogus'"),
    ("bench -r 5", "-r (root 5) must be a rank"),
    ("bench --backend gradwire --net 1gbe,topology=2x4 --world-size 3", "topology 2x4 holds 8 ranks"),
    # doctor
    ("doctor --timeout 0", "finite number of seconds > 0"),
    ("doctor --world-size 1", "needs a world size >= 2"),
    ("doctor --world-size -3", "--world-size"),
    ("doctor --probe-bytes 1", "--probe-bytes"),
    # net
    ("net describe bandwidth=1e-30bit", "bandwidth must be between 1 bit/s and 1 Pbit/s"),
    ("net describe latency=1e300s", "latency must be at most 3600 s"),
    ("net describe jitter=2e9ms", "jitter must be at most 3600 s"),
    ("net describe ,,,,", "empty token"),
    ("net describe 1gbe,", "empty token"),
    (f"net describe bandwidth={BIG}bit", "out of range"),
    (f"net describe seed={BIG}", "seed must be an integer"),
    ("net describe bandwidth=1e400gbit", "too large to represent"),
    ("net describe 1gbe,straggler=1:link=1e-9", "straggler link factor must be between"),
    ("net describe 1gbe -s 0", "from 1 byte to 1 PiB"),
    ("net describe 1gbe -s 1e30", "from 1 byte to 1 PiB"),
    ("net describe 1gbe,topology=2x4 -n 3", "topology 2x4 holds 8 ranks"),
    ("net describe 1gbe -n 0", "--world-size"),
    ("net describe 1gbe,straggler=5:link=0.5 -n 4", "straggler rank 5"),
    ("net describe loss=100%", "loss must be in [0, 100%)"),
    ("net describe 1gbe --ops bogus", "invalid choice: 'bogus'"),
    # demo
    ("demo -n 1", "from 2 to 8"),
    ("demo --steps 0", "--steps"),
    ("demo --net 1gbe,,latency=1ms", "empty token"),
    ("demo --net 1gbe,topology=2x4 -n 3", "topology 2x4 holds 8 ranks"),
    # the command line itself
    ("no-such-command", "invalid choice: 'no-such-command'"),
    ("bench --no-such-flag", "unrecognized arguments: --no-such-flag"),
]


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a command starts anything: ranks, trainings, subprocesses."""
    import gradwire.launch

    def started(*args, **kwargs):
        raise AssertionError("the command started work instead of refusing its input")

    monkeypatch.setattr(gradwire.launch, "spawn", started)
    monkeypatch.setattr(subprocess, "call", started)
    monkeypatch.setattr(subprocess, "Popen", started)


def _run(argv):
    return main(argv)  # argparse's refusals too come back as a code, not SystemExit


def _argv(text, paths):
    for key, value in paths.items():
        text = text.replace("{" + key + "}", value)
    return shlex.split(text)


def test_corpus_is_refused_in_one_line(tmp_path, capsys, no_work):
    """Every case: exit code 2, nothing on stdout, one line on stderr that names the problem."""
    assert len(CORPUS) >= 40
    paths = _files(tmp_path)
    refused, wrong = 0, []
    for text, expected in CORPUS:
        argv = _argv(text, paths)
        code = _run(argv)
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        ok = (code == 2 and not out and len(lines) == 1 and lines[0].startswith("gradwire")
              and "error: " in lines[0] and expected in lines[0] and "Traceback" not in err)
        if ok:
            refused += 1
        else:
            wrong.append(f"{text[:80]!r}: exit {code}, stdout {out[:200]!r}, stderr {err[:300]!r}")
    assert not wrong, f"{refused} of {len(CORPUS)} refused cleanly; the others:\n" + "\n".join(wrong)


def test_messages_echo_no_giant_input(capsys, no_work):
    """A 120,000-digit value is named, not printed back whole."""
    assert _run(["net", "describe", f"latency={BIG}us"]) == 2
    err = capsys.readouterr().err
    assert len(err) < 600 and "out of range" in err


@pytest.mark.parametrize("argv, expected", [
    (["net", "describe", ",,,,"], "empty token"),
    (["bench", "--timeout", "-1"], "finite number of seconds > 0"),
    (["profile", "--", "/nonexistent/cmd"], "no such file"),
])
def test_real_processes_refuse_in_one_line(argv, expected):
    proc = subprocess.run([sys.executable, "-m", "gradwire.cli.main", *argv],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and not proc.stdout
    assert proc.stderr.count("\n") == 1 and expected in proc.stderr and "Traceback" not in proc.stderr


def test_interrupt_is_one_line(monkeypatch, capsys):
    """Ctrl-C in any command: one line, exit code 130."""
    from gradwire.cli import net as net_cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(net_cli, "run_presets", interrupted)
    assert _run(["net", "presets"]) == 130
    assert capsys.readouterr().err == "gradwire net: interrupted\n"


def test_output_paths_are_checked_without_creating_anything(tmp_path):
    from gradwire._files import check_output_dir, check_output_file

    assert check_output_file(tmp_path / "new" / "deeper" / "out.json") == tmp_path / "new" / "deeper" / "out.json"
    assert check_output_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []  # neither folders nor the probe file are left behind
    (tmp_path / "old.json").write_text("{}")
    assert check_output_file(tmp_path / "old.json").read_text() == "{}"  # an existing file is checked, not touched
