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
