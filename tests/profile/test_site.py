"""The profile's sitecustomize: the one it shadows still runs, and a process without torch.distributed pays nothing."""
import os
import subprocess
import sys
import time

from gradwire.profile.bootstrap import child_env


def _env(tmp_path, pythonpath=None):
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        base["PYTHONPATH"] = pythonpath
    return child_env("1gbe", tmp_path / "prof", base=base)


def _python(code, env):
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_the_shadowed_sitecustomize_still_runs(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    mark = tmp_path / "mark"
    (user / "sitecustomize.py").write_text(f"open({str(mark)!r}, 'w').write('ran')\nLOADED_BY = 'user'\n")
    proc = _python("import sitecustomize; print(sitecustomize.LOADED_BY)", _env(tmp_path, str(user)))
    assert proc.returncode == 0, proc.stderr
    assert mark.read_text() == "ran"
    assert proc.stdout.strip() == "user"  # `import sitecustomize` finds the user's, as without the profile


def test_a_failing_sitecustomize_is_reported_as_python_does(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("raise RuntimeError('broken on purpose')\n")
    proc = _python("print('still here')", _env(tmp_path, str(user)))
    assert proc.returncode == 0 and proc.stdout.strip() == "still here"
    assert "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nRuntimeError: broken on purpose" in proc.stderr


def test_torch_distributed_is_wrapped_only_when_imported(tmp_path):
    env = _env(tmp_path)
    plain = _python("import sys; print('torch' in sys.modules, 'gradwire' in sys.modules)", env)
    assert plain.stdout.split() == ["False", "False"], plain.stderr
    code = ("import sys, torch.distributed as dist\n"
            "print(getattr(dist.init_process_group, '_gradwire_profile', False),\n"
            "      getattr(dist.destroy_process_group, '_gradwire_profile', False),\n"
            "      dist.distributed_c10d.destroy_process_group is dist.destroy_process_group,\n"
            "      dist.distributed_c10d.init_process_group is dist.init_process_group, 'gradwire' in sys.modules)")
    wrapped = _python(code, env)
    # wrapped, everywhere torch looks it up, and gradwire still not imported: that waits for a call
    assert wrapped.stdout.split() == ["True", "True", "True", "True", "False"], wrapped.stderr


def _fastest_start(env, runs=5):
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, timeout=60)
        best = min(best, time.perf_counter() - t0)
    return best


def test_a_child_without_torch_starts_as_fast_as_a_plain_one(tmp_path):
    """It took 1.9 s instead of 0.03 s when the sitecustomize imported torch and gradwire up front."""
    plain_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    plain = _fastest_start(plain_env)
    profiled = _fastest_start(_env(tmp_path))
    assert profiled < 2 * plain + 0.1, (plain, profiled)
