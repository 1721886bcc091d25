"""The CPU side of two GPU scripts: scripts/host_overhead.py (an eager call's host time) and scripts/gpu_fuzz.py
(--force-paths: the launcher's overrides drawn per case; a run cut by SIGTERM still reports), each run in a subprocess
under TRITON_INTERPRET=1."""

import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script: str, *args: str) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", script), *args], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout


def test_host_overhead_times_each_preset():
    """A row a preset, two positive times (route() and route(out=)) with Triton's launch stubbed out."""
    text = _run("host_overhead.py", "--presets", "mixtral,deepseek-v3", "--calls", "20", "--repeats", "1",
                "--device", "cpu")
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^(\S+)\s+([\d.]+)\s+([\d.]+)\s*$", text, re.M)}
    assert set(rows) == {"mixtral", "deepseek-v3"} and all(a > 0 and b > 0 for a, b in rows.values()), text


def test_fuzz_forces_the_launchers_paths():
    """--force-paths: the cases route like the reference, and the summary counts the launches' constexprs, among
    them paths the launcher's own choices never take at T <= 33 (the fast keys, a forced exact path)."""
    text = _run("gpu_fuzz.py", "--device", "cpu", "--cases", "40", "--seed", "70000", "--max-tokens", "33",
                "--max-width", "64", "--force-paths")
    assert "40 cases" in text and ": 0 failed" in text, text
    covered = {tag: int(n) for tag, n in re.findall(r"(\S+) (\d+)(?:,|$)", text.split("covered: ")[1])}
    assert covered.get("APPROX_KEYS", 0) > 0 and covered.get("FORCE_EXACT", 0) > 0, covered
    assert sum(n for tag, n in covered.items() if tag.startswith("rows-on-warps-")) > 0, covered


def test_fuzz_cut_by_sigterm_reports_the_cases_it_finished():
    """A `timeout` around the fuzz (a device call's limit) sends SIGTERM mid-case: the run stops at once and still
    prints its summary, the cut case named and not counted, with exit status 0 when none failed."""
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-u", os.path.join(ROOT, "scripts", "gpu_fuzz.py"), "--device", "cpu",
                             "--seconds", "600", "--seed", "70100", "--max-tokens", "9", "--max-width", "64"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    time.sleep(25)  # the imports and a few cases
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    m = re.search(r"^(\d+) cases in \d+ s \(seeds 70100\.\.(\d+), T 1\.\.9\): 0 failed; cut by SIGTERM in seed "
                  r"(\d+), not counted$", out, re.M)
    assert proc.returncode == 0 and m, out
    n, last, cut = (int(g) for g in m.groups())
    assert n > 0 and last == 70100 + n - 1 and cut == 70100 + n, out
    assert "covered: " in out, out


def _collected(shard: str | None) -> tuple[int, list[str]]:
    env = dict(os.environ)
    env.pop("MOEGATE_SHARD", None)
    if shard is not None:
        env["MOEGATE_SHARD"] = shard
    out = subprocess.run([sys.executable, "-m", "pytest", os.path.join(ROOT, "tests", "test_presets.py"),
                          "--collect-only", "-q", "-p", "no:cacheprovider"], env=env, capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    return out.returncode, [line for line in out.stdout.splitlines() if "::" in line]


def test_shards_split_the_suite_without_loss_or_overlap():
    """MOEGATE_SHARD=i/n (tests/conftest.py; scripts/gpu_check.sh's SHARD): the n shards together are the whole suite,
    each test in exactly one, in turn; a malformed or out-of-range shard is a usage error, not a silent full run."""
    rc, whole = _collected(None)
    assert rc == 0 and len(whole) >= 6, whole
    shards = [_collected(f"{i}/3") for i in (1, 2, 3)]
    assert all(rc == 0 for rc, _ in shards)
    assert [ids for _, ids in shards] == [whole[0::3], whole[1::3], whole[2::3]]
    for bad in ("0/3", "4/3", "2", "a/b"):
        rc, ids = _collected(bad)
        assert rc != 0 and not ids, (bad, ids)


def _pytest_with_settings(tmp_path, settings: str | None, body: str) -> subprocess.CompletedProcess:
    """Runs a one-test file under tests/conftest.py (as a plugin: the file lies outside tests/) with MOEGATE_SET."""
    (tmp_path / "test_settings_probe.py").write_text(body)
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    env.pop("MOEGATE_SET", None)
    if settings is not None:
        env["MOEGATE_SET"] = settings
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), os.path.join(ROOT, "tests"),
                                         env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "-q", "-p", "conftest", "-p",
                           "no:cacheprovider", "-p", "no:xdist"], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path))


def test_settings_reach_the_launcher_for_the_whole_run(tmp_path):
    """MOEGATE_SET="NAME=VALUE;..." (tests/conftest.py) sets moegate.kernels.router's settings before the tests run, so
    that the GPU suite can run on a form that is not the default yet; unset, the defaults hold; a name that is not a
    setting or a value that is not a literal stops the run as a usage error."""
    probe = ("import moegate.kernels.router as kr\n\n\ndef test_probe():\n"
             "    assert (kr.WARP_ROWS_SMEM_KEPT, kr.WARP_ROWS_EXTRA) == {expected}\n")
    out = _pytest_with_settings(tmp_path, "WARP_ROWS_SMEM_KEPT=True; WARP_ROWS_EXTRA=2",
                                probe.format(expected="(True, 2)"))
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    import moegate.kernels.router as kr

    defaults = (kr.WARP_ROWS_SMEM_KEPT, kr.WARP_ROWS_EXTRA)
    out = _pytest_with_settings(tmp_path, None, probe.format(expected=repr(defaults)))
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    for bad in ("NOT_A_SETTING=1", "WARP_ROWS_EXTRA=two", "WARP_ROWS_EXTRA"):
        out = _pytest_with_settings(tmp_path, bad, probe.format(expected="(True, 2)"))
        assert out.returncode != 0 and "MOEGATE_SET" in out.stderr + out.stdout, (bad, out.stdout[-2000:])
