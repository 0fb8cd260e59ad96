"""tests/warm.py: a child forked from the warm interpreter is what a fresh ``python`` would
have run (the snippet, storage and campaign tests run their processes through it)."""

import os
import sys

from warm import SUBPROCESS, python


def test_a_child_is_a_process_of_its_own_with_its_argv_folder_and_environment(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import os, sys\nprint(os.getpid(), sys.argv, sys.path[0], os.getcwd(),"
                      " os.environ.get('X'), __name__, sys.stdin.read() == '')\n"
                      "sys.exit(3)\n")
    r = python([script, "a"], cwd=tmp_path, env={**os.environ, "X": "y"})
    pid, *rest = r.stdout.split()
    assert r.returncode == 3 and int(pid) != os.getpid()
    assert rest == [f"['{script}',", "'a']", str(tmp_path), str(tmp_path), "y", "__main__",
                    "True"]


def test_a_name_not_imported_and_an_exception_fail_as_in_a_fresh_interpreter(tmp_path):
    r = python(["-c", "np.zeros(1)"], cwd=tmp_path)  # the server imported numpy, not as np
    assert r.returncode == 1 and "NameError: name 'np' is not defined" in r.stderr
    r = python(["-c", "import sys; sys.exit('bye')"], cwd=tmp_path)
    assert r.returncode == 1 and r.stderr == "bye\n"
    r = python(["-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], cwd=tmp_path)
    assert r.returncode == -9


def test_python_m_packtool_and_the_subprocess_stand_in(tmp_path):
    from conftest import ROOT

    r = SUBPROCESS.run([sys.executable, "-m", "packtool", "--version"], cwd=ROOT,
                       env=dict(os.environ), capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("packtool, version")
    r = python(["-m", "packtool", "verify", tmp_path / "nothing"], cwd=tmp_path,
               env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1 and "Traceback" not in r.stderr and "nothing" in r.stderr


def test_children_run_side_by_side_and_take_signals(tmp_path):
    """Two children that each wait for the other's file (the ranks of tests/test_distributed
    start so), and a child stopped by SIGTERM as a fresh process is."""
    from warm import shared

    code = ("import pathlib, sys, time\nme, other = sys.argv[1:]\npathlib.Path(me).touch()\n"
            "t = time.monotonic() + 60\n"
            "while not pathlib.Path(other).exists() and time.monotonic() < t:\n"
            "    time.sleep(0.01)\nsys.exit(0 if pathlib.Path(other).exists() else 5)\n")
    a, b = tmp_path / "a", tmp_path / "b"
    kids = [shared().start(["-c", code, x, y], cwd=tmp_path, env=dict(os.environ))
            for x, y in ((a, b), (b, a))]
    assert [k.wait(120).returncode for k in kids] == [0, 0]
    sleeper = shared().start(["-c", "import time; time.sleep(60)"], cwd=tmp_path,
                             env=dict(os.environ))
    sleeper.send_signal(15)
    assert sleeper.wait(60).returncode == -15
